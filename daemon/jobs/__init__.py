"""The record: the one module that owns SQL, and the job states with their one transition
table.
"""

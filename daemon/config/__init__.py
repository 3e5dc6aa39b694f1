"""The configuration: every key declared once, how keys are read and checked, the folder
checks.
"""

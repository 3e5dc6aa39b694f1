"""The end of the data path: rendering a finished document's files and publishing them
atomically.
"""

"""Stage 1 of the data path: watching the inboxes, deciding which files are ready, hashing them
into jobs.
"""

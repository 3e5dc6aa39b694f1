"""The supervisor, in the daemon process: starts the ONE worker process and watches its
health, feeds it a document page by page, records each page, and decides what the engine
is. It never loads the engine itself (daemon/worker/ does, in its own process).
"""

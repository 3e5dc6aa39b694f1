"""The worker process: the ONE process that loads the engine, fed page by page over the
typed messages of daemon/document/protocol.py. Nothing here touches the store or the outbox.
"""

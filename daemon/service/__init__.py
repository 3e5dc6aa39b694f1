"""The running daemon and what it shows: the main loop, the HTTP server, the status page,
metrics, health.
"""

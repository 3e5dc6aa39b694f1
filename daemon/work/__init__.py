"""The worker and its supervisor: one long-lived model process, fed page by page over typed
messages.
"""

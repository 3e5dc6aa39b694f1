"""The typed document: what an engine hands back for a page, carried unchanged to the outbox."""

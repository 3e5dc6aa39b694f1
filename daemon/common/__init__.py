"""Vocabulary every stage shares: failures and their hints, safe display, CPU counts,
units, the facts only the running daemon knows, running a child with a deadline."""

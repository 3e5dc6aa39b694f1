"""daemon/intake/: watching the inboxes, stability, folders that come and go; real
writers against the real daemon."""

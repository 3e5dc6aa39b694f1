"""daemon/supervisor/: the worker process started, watched and fed page by page; the
engine fallback."""

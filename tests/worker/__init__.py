"""daemon/worker/: the worker process's page pipeline."""

"""daemon/jobs/: the store, its tables and the job states."""

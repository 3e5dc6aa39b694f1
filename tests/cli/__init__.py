"""daemon/cli/: the command line as a user meets it."""

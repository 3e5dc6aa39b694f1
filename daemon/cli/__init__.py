"""The command line: `docinbox run|parse|status|...`, `docinbox parse`, `docinbox model`."""

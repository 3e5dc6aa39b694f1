"""daemon/config/: every key declared once, loading, checks, the shipped config.yaml."""

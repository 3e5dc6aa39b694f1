"""daemon/common/: the vocabulary every stage shares (CPU counts, the share lanes)."""

"""daemon/output/: the output files, the atomic outbox, the originals' fate; MinerU's own
output as the reference."""

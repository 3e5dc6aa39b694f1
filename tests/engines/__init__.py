"""daemon/engines/: the lite and mineru engines, MinerU's runtimes, the fidelity gates."""

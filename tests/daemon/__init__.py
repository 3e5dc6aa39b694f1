"""The whole daemon process with no one stage in focus: end to end, faults, shutdown,
shares, the container."""

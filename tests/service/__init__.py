"""daemon/service/: the main loop's surfaces: health, status page, metrics, hooks, reminders."""

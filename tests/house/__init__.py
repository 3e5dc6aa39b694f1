"""Checks over the code itself: layers, import cycles, the daemon process kept light,
README's module table."""

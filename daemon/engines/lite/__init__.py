"""The `lite` engine: offline, no model download. `engine.py` runs the page; its steps
(orientation, layout regions, reading order, junk lines) are one module each."""

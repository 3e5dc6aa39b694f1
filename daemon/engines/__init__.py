"""Engines turn one page image into blocks: `lite/` and `mineru/` (with its `runtimes/`).
`registry.py` chooses one by name. Importing this package is light."""

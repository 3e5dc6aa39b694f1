"""docinbox: turn documents dropped into a folder into Markdown and JSON.

Data path: watcher -> ingest -> store -> supervisor -> worker -> engine -> output (outbox).
"""

__version__ = "0.1.0"

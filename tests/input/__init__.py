"""daemon/document/formats.py and daemon/input/: what a file is and how it becomes pages."""

"""The `mineru` engine: MinerU2.5's two steps in `engine.py`; where generate() runs is a
runtime in `runtimes/`."""

"""The `lite` engine: offline, no model download. `engine.py` wires the page: lines from
`ocr` or the text layer (`lines.Line`), regions from `regions` or `figures`, composed into
blocks by `compose` (with `junk`, `reading_order`, `paragraphs`, `tables`); `orientation`
turns a scan upright first."""

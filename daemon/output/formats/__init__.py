"""The files a finished document becomes, rendered in memory from its pages' blocks.

One module per format: `markdown` (`<stem>.md`), `content_list`
(`<stem>_content_list.json`, MinerU's block list) and `meta` (`<stem>.meta.json`,
docinbox's provenance). Nothing here touches the disk: `publish` asks for the files and
hands them to `outbox`, which writes the folder atomically.
"""

"""The ``fgdata`` command line: Typer commands that parse, call the library and render with rich."""

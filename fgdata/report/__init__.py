"""``fgdata report``: a dataset at a glance, as one self-contained HTML file, a terminal summary and JSON.

``collect`` reads the shards, ``summarise`` turns the statistics into a JSON-ready document, ``html`` draws
the page (matplotlib, from the ``report`` extra, loads only there).
"""

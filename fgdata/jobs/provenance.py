"""``DST/provenance.json``: what made a folder's outputs, one entry per command (``encode latents``, ``shard
images``' row selection...), merged across the commands that wrote into it."""

from __future__ import annotations

import json
from typing import Any

from fgdata import storage

PROVENANCE_FILE = "provenance.json"
PROVENANCE_FORMAT = "fgdata.encode-provenance"


def write_provenance(dest: str, command: str, record: dict[str, Any], base: str | None = None) -> str:
    """Merge this command's record into ``DST/provenance.json`` (one entry per command, plus ``base``'s)."""
    path = storage.join(dest, PROVENANCE_FILE)
    doc: dict[str, Any] = {"format": PROVENANCE_FORMAT, "version": 1, "jobs": {}}
    for source in ([storage.join(base, PROVENANCE_FILE)] if base else []) + [path]:
        if storage.exists(source):
            try:
                old = json.loads(storage.read_bytes(source))
                doc["jobs"].update(old.get("jobs", {}))
            except ValueError:
                pass
    doc["jobs"][command] = record
    # the records of several producers (model sources, input folders): a URL among them without its credentials
    text = storage.redact_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    storage.write_bytes(path, (text + "\n").encode())
    return path

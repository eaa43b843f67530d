"""The closing summary every writing command prints with --json, checked the same way for each command."""

from __future__ import annotations

import json
import os
from typing import Any

SHARED_FIELDS = {"command", "source", "output", "seen", "written", "failed", "failures_file", "seconds"}


def check_json_summary(stdout: str, command: str, output: os.PathLike[str] | str) -> dict[str, Any]:
    """stdout is exactly one JSON document (json.loads refuses anything after it): the job's summary, whose
    inputs seen are all accounted for as written or failed, and whose failures file is on disk."""
    doc = json.loads(stdout)
    assert isinstance(doc, dict) and SHARED_FIELDS <= doc.keys(), doc
    assert doc["command"] == command and doc["output"] == str(output)
    assert doc["seen"] == doc["written"] + doc["failed"] and doc["seen"] > 0
    assert doc["failures_file"] is None or os.path.isfile(doc["failures_file"])
    return doc

"""prepare's read-back records: a partial zip's state and a zip's provenance are typed, and a torn
or foreign file reads as absent."""

from __future__ import annotations

import json

from fgdata.jobs.report import Failure
from fgdata.prepare.zipwriter import (Converted, Provenance, ZipState, provenance_path, read_partial_state,
                                      write_provenance)


def test_a_zips_provenance_reads_back_typed_and_a_foreign_or_torn_one_as_absent(tmp_path):
    dest = tmp_path / "set.zip"
    write_provenance(dest, {"dataset": "cifar10", "max_images": 3, "written": 2, "failed": 1,
                            "failures": [{"input": "row 1", "reason": "image-decode: bad"}],
                            "converted_modes": [{"input": "row 0", "mode": "L"}]})
    info = Provenance.read(dest)
    assert info is not None and info.written == 2 and info.launch is None
    assert info.failures == (Failure("row 1", "image-decode: bad"),) and info.converted == (Converted("row 0", "L"),)
    assert info.record["max_images"] == 3  # the fingerprint record, compared key by key on a rerun
    text = provenance_path(dest).read_text()
    provenance_path(dest).write_text(text[: len(text) // 2])
    assert Provenance.read(dest) is None
    assert Provenance.parse(json.dumps({"tool": "another tool", "written": 2}).encode()) is None
    assert Provenance.parse(b'{"tool": "fgdata 0.1", "failures": [{"input": "x"}]}') is None
    assert Provenance.read(tmp_path / "missing.zip") is None


def test_a_partial_zips_state_is_absent_when_torn_or_not_an_object(tmp_path):
    dest = tmp_path / "set.zip"
    (tmp_path / "set.zip.partial").write_bytes(b"")
    state = ZipState({"dataset": "cifar10", "inputs": 4, "max_images": None})
    (tmp_path / "set.zip.partial.json").write_bytes(state.to_bytes())
    assert read_partial_state(dest) == state
    (tmp_path / "set.zip.partial.json").write_bytes(state.to_bytes()[:-3])
    assert read_partial_state(dest) is None
    assert ZipState.parse(b"[1, 2]") is None


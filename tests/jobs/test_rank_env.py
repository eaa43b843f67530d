"""torchrun's RANK / WORLD_SIZE are read once, with the same one-line error for writers and loaders."""

from __future__ import annotations

import pytest

from fgdata.distributed import env_rank_world
from fgdata.errors import FgdataError
from fgdata.loaders.ranks import resolve_rank
from fgdata.loaders.selection import LoaderConfigError


@pytest.mark.parametrize("rank, world, message", [("x", "2", "RANK='x' is not an integer"),
                                                  ("0", "two", "WORLD_SIZE='two' is not an integer"),
                                                  ("2", "2", "need 0 <= RANK < WORLD_SIZE"),
                                                  ("0", "0", "need 0 <= RANK < WORLD_SIZE")])
def test_bad_values_fail_in_one_line_everywhere(monkeypatch, rank, world, message):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(FgdataError, match=message):
        env_rank_world()
    with pytest.raises(LoaderConfigError, match=message):
        resolve_rank()


def test_unset_means_one_process_and_values_are_read(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert env_rank_world() == resolve_rank() == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert env_rank_world() == resolve_rank() == (3, 4)
    assert resolve_rank(rank=1, world_size=2) == (1, 2)  # keywords win


def test_a_writing_command_reports_a_bad_rank_in_one_line(tmp_path):
    from inprocess import fgdata

    (tmp_path / "in").mkdir()
    res = fgdata("encode", "text", tmp_path / "in", tmp_path / "out", "--encoder", tmp_path / "no-model",
                 env={"RANK": "zero", "WORLD_SIZE": "2"})
    assert res.returncode == 1
    assert res.stderr.strip() == "error: RANK='zero' is not an integer (torchrun sets it; check your launcher)"

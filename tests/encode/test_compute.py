"""Decode-ahead and batching (fgdata.compute), which encode and fid-refs share: results in input order, each item's
exception in its place, the decoding on the job core's threads (fgdata.jobs.local.threaded_map), not a private pool."""

from __future__ import annotations

import threading

import pytest

from fgdata.compute import batches, prefetch_map


def _decode(item: int) -> tuple[int, str]:
    if item % 5 == 3:
        raise ValueError(f"cannot decode {item}")
    return item * item, threading.current_thread().name


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_prefetch_keeps_order_and_each_failure_in_its_place(workers):
    out = list(prefetch_map(_decode, range(20), workers, ahead=4))
    assert [item for item, _ in out] == list(range(20))
    for item, result in out:
        if item % 5 == 3:
            assert isinstance(result, ValueError) and str(result) == f"cannot decode {item}"
        else:
            assert not isinstance(result, BaseException) and result[0] == item * item


def test_prefetch_decodes_on_the_job_cores_threads():
    """Threads of the engine's threaded_map (its thread names), never this thread; none with workers=0."""
    threads = {result[1] for _, result in prefetch_map(_decode, range(12), 2, ahead=4)
               if not isinstance(result, BaseException)}
    assert threads and all(name.startswith("fgdata-fetch") for name in threads)
    inline = {result[1] for _, result in prefetch_map(_decode, range(4), 0, ahead=4)
              if not isinstance(result, BaseException)}
    assert inline == {threading.current_thread().name}


def test_batches_stream_fixed_sizes_with_a_short_last_one():
    assert list(batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batches([], 3)) == []
    assert list(batches(iter(range(4)), 2)) == [[0, 1], [2, 3]]

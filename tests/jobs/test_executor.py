"""run_units: one call runs a command's units on the executor the library chose."""

from __future__ import annotations

import os

import pytest

from fgdata.jobs.executor import Pool, run_units


def scaled(factor: int, number: int) -> tuple[int, int]:
    return number * factor, os.getpid()


def refuse_three(_: None, number: int) -> int:
    if number == 3:
        raise ValueError("unit 3 is bad")
    return number


def test_a_pool_runs_every_unit_in_call_order_with_the_shared_arguments():
    results = list(run_units(scaled, iter(range(20)), Pool(2), 3))
    assert [r for r, _ in results] == [n * 3 for n in range(20)]
    assert os.getpid() not in {pid for _, pid in results}  # two worker processes, not this one


def test_one_worker_runs_units_in_this_process_and_reads_the_calls_lazily():
    read = []

    def calls():
        for n in range(3):
            read.append(n)
            yield n

    seen = []
    for result, pid in run_units(lambda _, number: (number, os.getpid()), calls(), Pool(1), None):  # a closure is fine here
        seen.append(result)
        assert read == seen  # the next call is read only once this unit is done
        assert pid == os.getpid()
    assert seen == [0, 1, 2]


def test_a_unit_that_fails_ends_the_run_with_its_error_at_its_place():
    results = run_units(refuse_three, iter(range(6)), Pool(2), None)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="unit 3 is bad"):
        next(results)

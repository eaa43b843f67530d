"""Do this tree's writing commands write the same bytes as a baseline checkout's, on the repository's sample data?

Usage: ``python benchmarks/compare_outputs.py --baseline /path/to/checkout [--only NAME ...] [--keep DIR]``

Every writing command (the table of ``tests/determinism/samebytes.py``: shard images in each format, videos,
prompts; encode latents/text/neg-prompt and kd pairs/paths with tiny random models; prepare cifar10 / imagenet-64 /
imagenet-256 on small fixtures; fid-refs; count-shards, verify --write-ignore, report, score and dedup on a copy of
a dataset; quickstart) runs once with fgdata imported from the baseline checkout and once from this tree, each in
a subprocess, into the same folder path (so paths written into outputs agree), and every file it wrote is compared
byte for byte, with report's documented ``generated`` time masked as the determinism test masks it.

The engine's own state under ``DST/.fgdata`` (markers, plans, leases, work folders, outputs.json) is listed on
its own line and never fails the comparison: its format may change. Everything else must match. One line per
command; the exit status is 1 when any command wrote something different (or failed), else 0.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the sample data's fixtures (conftest) live beside the tests
sys.path.insert(0, str(REPO / "tests" / "determinism"))

from samebytes import (  # noqa: E402
    READING_WRITERS, CommandFailed, build_inputs, bytes_of, commands, copy_dataset, run)

from fgdata.catalog import SAMPLE_DATA  # noqa: E402

ENGINE_STATE = ".fgdata"  # a path part that marks the engine's own records


def _is_state(rel: str) -> bool:
    return ENGINE_STATE in rel.split("/")


def _compare(base: dict[str, bytes], mine: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """(output files that differ, are missing or are new; engine-state files that do), each sorted."""
    differ = sorted(rel for rel in base.keys() | mine.keys() if base.get(rel) != mine.get(rel))
    return [rel for rel in differ if not _is_state(rel)], [rel for rel in differ if _is_state(rel)]


def _why(rel: str, base: dict[str, bytes], mine: dict[str, bytes]) -> str:
    if rel not in mine:
        return f"{rel} (only the baseline wrote it)"
    if rel not in base:
        return f"{rel} (only this tree wrote it)"
    return f"{rel} ({len(base[rel]):,} vs {len(mine[rel]):,} bytes)"


class Runner:
    """Runs one command with both trees into ``work/run/<name>`` and moves each result aside."""

    def __init__(self, work: Path, trees: dict[str, Path]) -> None:
        self.work, self.trees = work, trees

    def both(self, name: str, argv: list[str], dataset: Path | None = None,
             expect: tuple[int, ...] = (0,)) -> dict[str, Path]:
        """The folder each tree's run wrote; a reading command gets a fresh copy of ``dataset`` as ``ds``."""
        slug = name.replace(" ", "_").replace("-", "")
        here, kept = self.work / "run" / slug, {}
        for side, tree in self.trees.items():
            here.mkdir(parents=True)
            try:
                if dataset is None:
                    run(argv, here / "out", tree=tree, expect=expect)
                else:
                    copy_dataset(dataset, here)
                    run(argv, "ds", tree=tree, cwd=here, expect=expect)
            except CommandFailed as e:
                raise CommandFailed(f"with the {side} tree, {e}") from e
            kept[side] = self.work / side / slug
            kept[side].parent.mkdir(parents=True, exist_ok=True)
            here.rename(kept[side])
        return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of fgdata to compare against")
    parser.add_argument("--only", action="append", default=[], help="run only this command (repeatable)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    baseline = args.baseline.resolve()
    if not (baseline / "fgdata" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline}: not an fgdata checkout (no fgdata/__init__.py)")
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="fgdata-compare-"))
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: not empty")
    try:
        return _compare_all(baseline, work, set(args.only))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _compare_all(baseline: Path, work: Path, only: set[str]) -> int:
    t0 = time.perf_counter()
    inputs = build_inputs(work / "inputs", SAMPLE_DATA, SAMPLE_DATA / "bigbuckbunny.mp4")
    table = commands(inputs)
    names = [*table, *READING_WRITERS, "quickstart"]
    unknown = only - set(names)
    if unknown:
        print(f"unknown command(s): {', '.join(sorted(unknown))}; known: {', '.join(names)}", file=sys.stderr)
        return 2
    runner = Runner(work, {"baseline": baseline, "current": REPO})
    print(f"baseline {baseline}\ncurrent  {REPO}\ninputs built in {time.perf_counter() - t0:.0f} s")
    dataset = None
    if only & set(READING_WRITERS) or not only:  # what the reading commands read: the baseline's shards
        dataset = work / "dataset"
        run(table["shard images"], dataset, tree=baseline)
    bad = 0
    for name in names:
        if only and name not in only:
            continue
        t = time.perf_counter()
        try:
            if name in READING_WRITERS:
                argv, expect = READING_WRITERS[name]
                kept = runner.both(name, argv, dataset, expect)
            else:
                kept = runner.both(name, ["quickstart", "{out}"] if name == "quickstart" else table[name])
        except CommandFailed as e:
            bad += 1
            said = [line.strip(" │╭╮╰╯─") for line in str(e).splitlines()]  # rich's error box, unframed
            said = [line for line in said if line]
            print(f"FAILED     {name}: {said[0]}{f' ... {said[-1]}' if len(said) > 1 else ''}")
            continue
        base, mine = bytes_of(kept["baseline"]), bytes_of(kept["current"])
        outputs, state = _compare(base, mine)
        took = f"[{time.perf_counter() - t:.0f} s]"
        if outputs or not base:
            bad += 1
            why = _why(outputs[0], base, mine) if outputs else "wrote nothing"
            print(f"DIFFERENT  {name}: {why}{f' and {len(outputs) - 1} more' if len(outputs) > 1 else ''} {took}")
        else:
            print(f"same       {name}: {sum(not _is_state(r) for r in base)} files {took}")
        if state:
            print(f"           engine state differs (allowed): {', '.join(state[:5])}"
                  f"{f' and {len(state) - 5} more' if len(state) > 5 else ''}")
    print(f"{'all the same' if not bad else f'{bad} command(s) differ or failed'} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

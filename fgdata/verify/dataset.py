"""Verifying datasets: every shard, the keys across shards, and the side files.

Each folder is its own dataset (fgdata numbers keys from ``sample_000000`` in every
dataset): keys must be unique within a folder, and each folder's ``shard_count.json``
describes its own shards. Several folders verified together get one report whose
rows and side files name every shard by its path.

The outputs close the quarantine loop (PEERS pain point 7): an ignore index of
the bad samples and a shard-count file of the samples physically present and readable
in each shard. Loaders subtract the first from the second, so every position of a
verified dataset maps to a sample that decodes, and resume positions stay exact.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from fgdata import storage
from fgdata.errors import FgdataError
from fgdata.shards import COUNT_FILE, ShardCount, ShardSet, read_shard_counts, resolve_shards, write_ignore_index
from fgdata.shards import write_counts as write_count_files
from fgdata.shards.ignore import qualified_names
from fgdata.shards.scan import scan_shard
from fgdata.verify.shard import Problem, ShardResult, check_shard, key_hash
from fgdata.workers import OrderedMap, serial_map

Progress = Callable[[ShardResult], None]


@dataclass
class VerifyReport:
    """Per-shard results plus dataset-level findings (count file, keys across shards)."""

    path: str
    shards: list[ShardResult]
    problems: list[Problem] = field(default_factory=list)
    decode: bool = False
    require: tuple[str, ...] = ()
    count_file: str | None = None
    selection: ShardSet = field(default_factory=lambda: ShardSet([]))

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.shards)

    @property
    def several(self) -> bool:
        """True when the shards come from more than one folder (dataset)."""
        return len(self.selection.folders) > 1

    def label(self, result: ShardResult) -> str:
        """How rows and messages name a shard: its basename for one dataset, else its path."""
        return self.selection.label(result.shard)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def readable(self) -> int:
        return sum(s.readable or 0 for s in self.shards)

    @property
    def bad_samples(self) -> int:
        return sum(len(s.bad_keys) for s in self.shards)

    @property
    def by_reason(self) -> Counter:
        total: Counter = Counter(p.reason for p in self.problems)
        for s in self.shards:
            total.update(s.by_reason)
        return total

    @property
    def warnings(self) -> list[str]:
        """Findings that are not damage (verify still passes): a dataset whose samples carry several image
        formats (the one-format rule is per dataset: what HF datasets reads as one, and what ``shard images``
        writes); and datasets checked together that each hold one format but not the same one, which only a
        loader reading them together with a one-extension key_map would trip on."""
        from fgdata.media.decode import mixed_image_formats

        by_shard = {s.shard: s for s in self.shards}
        per_dataset: dict[str, Counter] = {}
        for folder, shards in self.selection.datasets.items():
            exts = per_dataset.setdefault(folder, Counter())
            for shard in shards:
                if shard in by_shard:
                    exts.update(by_shard[shard].image_exts)
        out = []
        for folder, exts in per_dataset.items():
            mixed = mixed_image_formats(exts)
            if mixed:
                out.append(f"mixed image formats{f' in {folder}' if self.several else ''}: {mixed[0]}")
        single = {folder: next(iter(exts)) for folder, exts in per_dataset.items() if len(exts) == 1}
        if len(set(single.values())) > 1:
            formats = "; ".join(f"{folder}: {ext}" for folder, ext in single.items())
            joined = ";".join(sorted(set(single.values())))
            out.append(f"the datasets hold different image formats ({formats}): each is one format, but a loader "
                       f"that reads them together needs every extension in its key_map (e.g. {{'real': '{joined}'}}, "
                       "as fgdata's configs list them)")
        return out

    def ignore_mapping(self) -> dict[str, list[str]]:
        """Shard -> bad keys; every key listed is among the shard's readable samples.

        A shard is named by its basename for one dataset, else by its qualified name, as ``fgdata dedup`` names
        it: basenames repeat across datasets, and a qualified name still matches after the datasets move."""
        names = qualified_names([s.shard for s in self.shards]) if self.several else {s.shard: s.name for s in self.shards}
        return {names[s.shard]: sorted(s.bad_keys) for s in self.shards if s.bad_keys}

    def readable_counts(self) -> dict[str, int]:
        """Shard (as rows name it) -> samples physically present and readable; never minus ignored keys."""
        unknown = [self.label(s) for s in self.shards if s.readable is None]
        if unknown:
            raise FgdataError(
                f"{self.path}: {len(unknown)} shard(s) could not be read to the end ({', '.join(unknown[:3])}"
                f"{', ...' if len(unknown) > 3 else ''}); their counts are unknown, rerun verify"
            )
        return {self.label(s): int(s.readable or 0) for s in self.shards}

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "datasets": self.dataset_summaries(),
            "ok": self.ok,
            "decode": self.decode,
            "require": list(self.require),
            "count_file": self.count_file,
            "shards": len(self.shards),
            "samples": self.samples,
            "readable": self.readable,
            "bad_samples": self.bad_samples,
            "by_reason": dict(sorted(self.by_reason.items())),
            "notes": dict(sorted(Counter(n.reason for s in self.shards for n in s.notes).items())),
            "problems": [p.to_json() for p in self.problems],
            "warnings": self.warnings,
            "ignore": self.ignore_mapping(),
            "per_shard": [s.to_json() for s in self.shards],
        }

    def dataset_summaries(self) -> list[dict]:
        """One line of figures per dataset (folder); the report's own ``problems`` are not split."""
        by_shard = {s.shard: s for s in self.shards}
        out = []
        for folder, shards in self.selection.datasets.items():
            results = [by_shard[s] for s in shards if s in by_shard]
            out.append({"path": folder, "ok": all(s.ok for s in results), "shards": len(results),
                        "samples": sum(s.samples for s in results), "readable": sum(s.readable or 0 for s in results),
                        "bad_samples": sum(len(s.bad_keys) for s in results)})
        return out


def _check(item: tuple[str, int | None], decode: bool, require: tuple[str, ...]) -> ShardResult:
    """One shard's check (module-level, so a pool worker can run it)."""
    return check_shard(item[0], size=item[1], decode=decode, require=require)


def _run_shards(shards: list[str], sizes: dict[str, int], *, decode: bool, require: tuple[str, ...], workers: int,
                progress: Progress | None) -> list[ShardResult]:
    """Check every shard, ``workers`` at a time, on the job core's pools: decoding in processes (CPU-bound; a
    worker that dies ends verify with one line, nothing written), reading headers in threads."""
    from fgdata.jobs.executor import process_map, thread_map

    run: OrderedMap = serial_map
    if workers > 1 and len(shards) > 1:
        run = process_map(workers, "checking the shards", ("fgdata.verify.shard",)) if decode else thread_map(workers)
    results = []
    for result in run(functools.partial(_check, decode=decode, require=require), [(s, sizes.get(s)) for s in shards]):
        if progress is not None:
            progress(result)
        results.append(result)
    return results


def _cross_shard_duplicates(results: list[ShardResult], label: Callable[[ShardResult], str]) -> None:
    """Keys are unique in a dataset (the shards of one folder). Later occurrences in other shards
    become bad samples; ``label`` names the shard that had the key first."""
    hashes = [r.key_hashes for r in results]
    if not hashes:
        return
    owner = np.concatenate([np.full(len(h), i, dtype=np.int64) for i, h in enumerate(hashes)])
    flat = np.concatenate(hashes)
    if len(flat) < 2:
        return
    order = np.argsort(flat, kind="stable")
    sorted_hashes = flat[order]
    dup = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    if not len(dup):
        return
    suspects: dict[int, set[int]] = {}  # shard index -> duplicated hashes present in it
    for i in dup:
        for j in (i, i + 1):
            suspects.setdefault(int(owner[order[j]]), set()).add(int(sorted_hashes[j]))
    first_shard: dict[str, int] = {}
    for si in sorted(suspects):
        keys = _keys_of(results[si])
        for key in dict.fromkeys(keys):
            if key_hash(key) not in suspects[si]:
                continue
            if key in first_shard and first_shard[key] != si:
                results[si].problems.append(
                    Problem("duplicate-key", f"key also in {label(results[first_shard[key]])}", key)
                )
            else:
                first_shard.setdefault(key, si)


def _keys_of(result: ShardResult) -> list[str]:
    """The readable keys of a shard, again: only for shards that hold a duplicated key hash."""
    return [s.key for s in scan_shard(result.shard).samples]


def _check_counts(report: VerifyReport, count_file: str | None) -> None:
    """Each count file must list its shards, each with its readable count.

    The count file beside a whole folder must list exactly its shards; for single shards or a
    pattern only their own entries are checked. A folder without a count file is not checked.
    """
    selection = report.selection
    by_file: dict[str, list[ShardResult]] = {}
    for shard in report.shards:
        by_file.setdefault(count_file or storage.join(selection.folder_of(shard.shard), COUNT_FILE), []).append(shard)
    for path, shards in by_file.items():
        if count_file is None and not storage.exists(path):
            continue  # no count file beside the shards: nothing to disagree with
        report.count_file = path if report.count_file is None else report.count_file
        name = path if report.several else storage.basename(path)
        try:
            counts = read_shard_counts(path)
        except FgdataError as exc:
            report.problems.append(Problem("counts-invalid", str(exc).splitlines()[0]))
            continue
        for shard in shards:
            if shard.name not in counts:
                shard.problems.append(Problem("counts-missing", f"{name} does not list this shard"))
            elif shard.readable is not None and counts[shard.name] != shard.readable:
                shard.problems.append(
                    Problem("counts-mismatch", f"{name} says {counts[shard.name]}, {shard.readable} readable")
                )
        if all(selection.given_whole(s.shard) for s in shards):
            extra = sorted(set(counts) - {s.name for s in shards})
            if extra:
                report.problems.append(Problem("counts-extra", f"{name} lists unknown shards: {', '.join(extra[:5])}"))


def verify_dataset(
    path: str | Sequence[str],
    *,
    decode: bool = False,
    require: Sequence[str] = (),
    workers: int = 4,
    count_file: str | None = None,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every shard ``path`` names (a folder or prefix, shards, a brace pattern); raise only
    if the shards cannot be found or listed.

    ``on_start`` gets the number of shards once they are resolved; ``progress`` each finished shard.
    """
    require = tuple(dict.fromkeys(e.strip().lower().lstrip(".") for e in require if e.strip()))
    selection = resolve_shards(path)
    if count_file is not None and len(selection.folders) > 1:
        raise FgdataError(f"--count-file {count_file}: one count file cannot describe the shards of "
                          f"{len(selection.folders)} folders ({', '.join(selection.folders[:3])}); verify each "
                          "folder against its own shard_count.json (leave out --count-file)")
    if on_start is not None:
        on_start(len(selection.shards))
    results = _run_shards(selection.shards, selection.sizes, decode=decode, require=require, workers=workers, progress=progress)
    label = path if isinstance(path, str) else " ".join(path)
    report = VerifyReport(label, results, decode=decode, require=require, selection=selection)
    check_datasets(report, count_file)
    return report


def check_datasets(report: VerifyReport, count_file: str | None = None) -> None:
    """The checks across shards, per dataset (folder): keys unique within it (later copies become bad samples)
    and its count file against its shards. ``fgdata report`` runs them on its own shard checks too."""
    by_shard = {r.shard: r for r in report.shards}
    for shards in report.selection.datasets.values():
        _cross_shard_duplicates([by_shard[s] for s in shards if s in by_shard], report.label)
    _check_counts(report, count_file)


def write_ignore(report: VerifyReport, path: str) -> dict[str, list[str]]:
    """Write the ignore index (always, even when empty: ``{}`` is a valid, non-empty file)."""
    mapping = report.ignore_mapping()
    write_ignore_index(path, dict(mapping.items()))
    return mapping


def write_counts(report: VerifyReport, path: str | None = None) -> str:
    """Write readable counts to ``path``, or to the shard_count.json beside the shards (one per folder).

    A whole folder's count file lists exactly its shards; for single shards or a pattern only
    their entries change. Returns the file(s) written.
    """
    report.readable_counts()  # raises when a shard's count is unknown
    rows = [ShardCount(s.shard, s.name, int(s.readable or 0), s.size or 0) for s in report.shards]
    return ", ".join(u.path for u in write_count_files(rows, report.selection, path))


def report_json(report: VerifyReport) -> str:
    return json.dumps(report.to_json(), indent=1)


__all__ = ["VerifyReport", "check_datasets", "verify_dataset", "write_counts", "write_ignore", "report_json"]

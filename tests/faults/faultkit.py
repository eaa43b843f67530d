"""Fault-injection helpers: small shards of every member type, crafted tars, seeded damage, SIGKILL trials.

Everything is seeded: a failing trial names its seed and reproduces.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

REPO = Path(__file__).resolve().parents[2]
FGDATA = [sys.executable, "-m", "fgdata"]


# -- payloads -----------------------------------------------------------------

def png_bytes(i: int, size: int = 16) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), ((37 * i) % 256, (11 * i) % 256, 128)).save(buf, "PNG")
    return buf.getvalue()


def jpg_bytes(i: int, size: int = 16) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), ((37 * i) % 256, 64, (11 * i) % 256)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def npy_bytes(i: int) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.full((2, 3), i, dtype=np.float32))
    return buf.getvalue()


def pth_bytes(i: int) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(torch.full((2, 2), float(i)), buf)
    return buf.getvalue()


def sample_members(i: int, kinds: Sequence[str]) -> dict[str, bytes]:
    make = {
        "png": lambda: png_bytes(i),
        "jpg": lambda: jpg_bytes(i),
        "txt": lambda: f"caption {i}".encode(),
        "json": lambda: json.dumps({"i": i, "score": i / 10}).encode(),
        "npy": lambda: npy_bytes(i),
        "latent.pth": lambda: pth_bytes(i),
    }
    return {k: make[k]() for k in kinds}


def write_dataset(dest: Path, n: int = 12, maxcount: int = 4, kinds: Sequence[str] = ("png", "txt"),
                  override: dict[int, dict[str, bytes | None]] | None = None) -> dict[str, int]:
    """Write ``n`` samples ``sample_%06d`` with ShardWriter; ``override[i][ext]`` replaces (or with None drops) a member."""
    from fgdata.shards import ShardWriter

    w = ShardWriter(str(dest), maxcount=maxcount)
    for i in range(n):
        members = sample_members(i, kinds)
        for ext, data in (override or {}).get(i, {}).items():
            if data is None:
                members.pop(ext, None)
            else:
                members[ext] = data
        w.write(f"sample_{i:06d}", members)
    return w.close().counts


def make_tar(path: Path, members: Sequence[tuple], fmt: int = tarfile.PAX_FORMAT) -> None:
    """A tar from (name, bytes) pairs, or (name, type, linkname) for links, directories and devices."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for m in members:
            info = tarfile.TarInfo(m[0])
            info.mtime = 0
            if len(m) == 2:
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
            else:
                info.type, info.linkname = m[1], m[2]
                tar.addfile(info)


# -- damage -------------------------------------------------------------------

@dataclass
class Layout:
    """Where a shard's headers and payloads lie (from its own intact bytes)."""

    headers: list[tuple[int, int]]
    payloads: list[tuple[int, int, str]]


def layout(path: Path) -> Layout:
    from fgdata.shards import iter_members

    headers, payloads = [], []
    with open(path, "rb") as f:
        for entry, _ in iter_members(f, total=path.stat().st_size):
            headers.append((entry.header_offset, entry.data_offset))
            if entry.size:
                payloads.append((entry.data_offset, entry.data_offset + entry.size, entry.name))
    return Layout(headers, payloads)


def truncate_at(path: Path, offset: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:offset])


def flip_bits(path: Path, offsets: Sequence[int], rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    for off in offsets:
        data[off] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


# -- processes ----------------------------------------------------------------

def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m fgdata ARGS`` with captured text output and a bounded wait."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*FGDATA, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def assert_clean_failure(proc: subprocess.CompletedProcess) -> None:
    """Exit 1 with a one-line error or a report, never a Python traceback."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]


def is_temporary(name: str) -> bool:
    return name.startswith(".") or ".tmp" in name or name.endswith(".part")


def tree(root: Path, skip: Callable[[str], bool] = lambda rel: False) -> dict[str, str]:
    """relative path -> sha256 of every file below ``root``."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not skip(rel):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@dataclass
class KillResult:
    delay: float
    killed: bool
    returncode: int | None


def run_and_kill(cmd: Sequence[str], *, watch: Path, delay: float, cwd: Path | None = None, env: dict | None = None,
                 timeout: float = 120) -> KillResult:
    """Start ``cmd`` in its own process group; ``delay`` s after ``watch`` first holds a file, SIGKILL the group.

    Waiting for the first output file makes the kill land while the job writes, not while Python imports.
    If the job finishes first, nothing is killed (the trial then checks a finished run).
    """
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and not _has_files(watch):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd} wrote nothing in {timeout} s")
            time.sleep(0.005)
        end = time.monotonic() + delay
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.002)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:  # only on a timeout: never leave our own job behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    return KillResult(delay, killed, proc.returncode)


def _has_files(root: Path) -> bool:
    return root.exists() and any(p.is_file() for p in root.rglob("*"))


def timed_run(cmd: Sequence[str], *, watch: Path, cwd: Path | None = None, env: dict | None = None,
              timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    """Run to the end; return the result and the seconds from its first output file to its exit."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if first is None and _has_files(watch):
            first = time.monotonic()
        if time.monotonic() > deadline:
            proc.kill()
            break
        time.sleep(0.005)
    out, err = proc.communicate()
    end = time.monotonic()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), end - (first or end)


def check_final_names(root: Path, reference: dict[str, str], exact: Callable[[str], bool]) -> None:
    """After a kill: every file under a final name is complete.

    Files ``exact(rel)`` selects (shards, zips, indexes) must be byte-identical to the
    uninterrupted run's; every other JSON must parse (a count file may list fewer shards).
    """
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or any(is_temporary(part) for part in rel.split("/")):
            continue  # temporary names and hidden work folders are a job's private state
        if exact(rel):
            assert rel in reference, f"{rel}: not produced by an uninterrupted run"
            assert hashlib.sha256(p.read_bytes()).hexdigest() == reference[rel], f"{rel}: partial or different bytes under a final name"
        elif p.suffix == ".json":
            json.loads(p.read_bytes())


def kill_trials(cmd: Sequence[str], *, out: Path, clean: Path, seed: int, trials: int, cwd: Path | None = None,
                env: dict | None = None, exact: Callable[[str], bool] = lambda rel: rel.endswith((".tar", ".zip")),
                skip: Callable[[str], bool] = lambda rel: False, reruns: int = 1,
                after_kill: Callable[[Path], None] | None = None) -> list[KillResult]:
    """The generic SIGKILL check: run ``cmd`` (whose output goes to ``out``) uninterrupted into ``clean`` first,
    then ``trials`` times: kill it at a seeded random moment, check final names, call ``after_kill(output folder)``
    (what a caller of a bare writer does before it writes again), rerun, compare trees byte-for-byte.

    ``cmd`` holds the placeholder ``{out}``, replaced by the output folder of each run.
    """
    def argv(dest: Path) -> list[str]:
        return [a.replace("{out}", str(dest)) for a in cmd]

    done, span = timed_run(argv(clean), watch=clean, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = tree(clean, skip)
    rng = random.Random(seed)
    results = []
    for t in range(trials):
        dest = out / f"trial{t}"
        result = run_and_kill(argv(dest), watch=dest, delay=rng.uniform(0, span), cwd=cwd, env=env)
        results.append(result)
        check_final_names(dest, reference, exact)
        if after_kill is not None:
            after_kill(dest)
        for _ in range(reruns):
            again = subprocess.run(argv(dest), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)
            assert again.returncode == 0, f"trial {t} (seed {seed}, delay {result.delay:.3f}): {again.stderr[-3000:]}"
        got = tree(dest, skip)
        assert got == reference, f"trial {t} (seed {seed}, delay {result.delay:.3f}): output differs: " + str(
            sorted(set(got.items()) ^ set(reference.items()))[:6])
    return results


# -- stopping a job at a point it signals (FGDATA_TEST_STOP_AFTER), then a signal ---------------------------

STOP_MARK = "fgdata-test-hook: paused"


@dataclass
class Stopped:
    returncode: int
    stderr: str
    workers: list[int]  # pids of the job's descendants while it was paused


def descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def _paused_at(cmd: Sequence[str], env: dict, cwd: Path | None, mark: str, timeout: float,
               point: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """Start ``cmd`` in a session of its own and read its stderr up to the line holding ``mark`` (the point the job
    signals and waits at); yields the process and the lines read. A process still running when the block is left
    (only when the test itself failed) is killed with its whole group: a test never leaves its job behind."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if mark in line:
                break
        else:
            proc.wait(timeout=timeout)
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {point}: {''.join(lines)[-2000:]}")
        yield proc, lines
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_ranks(cmd: Sequence[str], world: int = 2, timeout: float = 600) -> list[dict[str, Any]]:
    """``cmd`` started at once as each torchrun rank of ``world`` (RANK, WORLD_SIZE, LOCAL_RANK set), each asked for
    ``--json``: every rank's JSON document, in rank order, once all have exited 0."""
    procs = [subprocess.Popen([*cmd, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r)})
             for r in range(world)]
    docs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        docs.append(json.loads(out))
    return docs


def stop_and_signal(cmd: Sequence[str], *, after: int, sig: int, env: dict | None = None, cwd: Path | None = None,
                    timeout: float = 300) -> Stopped:
    """Run ``cmd`` until it pauses after its ``after``-th output, then send ``sig`` and wait for it to end.

    SIGINT goes to the whole process group (as Ctrl-C in a terminal does); SIGTERM and SIGKILL to the main
    process only (as ``kill PID`` does), so pool workers must be stopped by the job itself.
    """
    full_env = {**os.environ, **(env or {}), "FGDATA_TEST_STOP_AFTER": str(after)}
    with _paused_at(cmd, full_env, cwd, STOP_MARK, timeout, f"its output {after}") as (proc, lines):
        workers = descendants(proc.pid)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        rest = proc.stderr.read()
        proc.wait(timeout=timeout)
    return Stopped(proc.returncode, "".join(lines) + rest, workers)


def leftovers(root: Path) -> list[str]:
    """Temporary or staging files fgdata may leave: none after a completed rerun."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if ".fgtmp-" in p.name or ".tmp-" in p.name or p.name.endswith((".partial", ".partial.log")))


def uninterrupted(cmd: Sequence[str], *, env: dict | None = None) -> subprocess.CompletedProcess:
    """A run that nothing stops (a kill test's reference run, or its rerun after the stop): ``fgdata`` runs in this
    process (tests/inprocess.py), sparing a new interpreter's imports (torch for a model command); no signal or
    process tree is tested on it. The stopped run stays a real process."""
    from inprocess import fgdata

    if list(cmd[: len(FGDATA)]) != FGDATA:
        return subprocess.run(list(cmd), env={**os.environ, **(env or {})}, capture_output=True, text=True,
                              timeout=300)
    return fgdata(*cmd[len(FGDATA):], env=env)


def stop_trials(cmd: Sequence[str], *, out: Path, clean: Path, stops: Sequence[tuple[int, int]],
                env: dict | None = None, skip: Callable[[str], bool] = lambda rel: rel.startswith(".fgdata/")) -> None:
    """The kill/resume check at job-signalled points: for each ``(after, signal)``, stop the job once it paused after
    its ``after``-th output, signal it, rerun it, and compare the whole tree byte for byte with an uninterrupted run;
    no temporary or staging file may be left. ``cmd`` holds ``{out}``, replaced by each run's output folder. The
    stopped run is a real process killed by a real signal; the reference run and the rerun run in this process
    (:func:`uninterrupted`)."""
    def argv(dest: Path) -> list[str]:
        return [a.replace("{out}", str(dest)) for a in cmd]

    done = uninterrupted(argv(clean), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = tree(clean, skip)
    for t, (after, sig) in enumerate(stops):
        dest = out / f"stop{t}"
        stopped = stop_and_signal(argv(dest), after=after, sig=sig, env=env)
        expected = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
        assert stopped.returncode == expected, f"stop {t}: exit {stopped.returncode}: {stopped.stderr[-2000:]}"
        if sig != signal.SIGKILL:
            last = stopped.stderr.strip().splitlines()[-1]
            assert last.startswith("interrupted: ") and last.endswith(" inputs done; rerun the same command to resume"), \
                stopped.stderr[-2000:]
        again = uninterrupted(argv(dest), env=env)
        assert again.returncode == 0, f"stop {t}: {again.stderr[-3000:]}"
        assert tree(dest, skip) == reference, f"stop {t} (after {after}, signal {sig}): output differs"
        assert leftovers(dest) == [], f"stop {t}: {leftovers(dest)}"


# -- holding one rank at a point it signals (FGDATA_TEST_HOLD), to order two ranks' steps ---------------------

HELD_MARK = "fgdata-test-hook: held"


@dataclass
class Held:
    returncode: int
    output: str  # everything the launch printed, stdout and stderr together
    holds: list[str]  # the hold lines, in order
    seen: str  # the line ``until`` accepted before the first hold was released


def hold_and_release(cmd: Sequence[str], *, hold: str, until: Callable[[str], bool], releases: int = 1,
                     env: dict | None = None, cwd: Path | None = None, timeout: float = 240) -> Held:
    """Run ``cmd`` (a torchrun launch) with ``FGDATA_TEST_HOLD=hold``. Once the first hold is in place and
    ``until`` has accepted a line (what the other ranks did meanwhile; the two may come in either order, as
    the ranks do not start together), release that hold with SIGUSR1, then each later hold as it comes,
    ``releases`` in all; then wait for the launch to end."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env={**os.environ, **(env or {}), "FGDATA_TEST_HOLD": hold},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    holds: list[str] = []
    seen: str | None = None
    released = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if HELD_MARK in line:
                holds.append(line)
            elif seen is None and until(line):
                seen = line
            while seen is not None and released < len(holds):  # each hold in place, once the line has come
                os.kill(int(re.findall(r"pid (\d+)", holds[released])[0]), signal.SIGUSR1)
                released += 1
            if released == releases:
                break
        else:
            raise AssertionError(f"the launch ended before its holds and the awaited line: {''.join(out)[-3000:]}")
        out.append(proc.communicate(timeout=timeout)[0])
        assert seen is not None  # released only once it came
    finally:
        if proc.poll() is None:  # torchrun starts each rank in its own session: kill them by pid
            for pid in [proc.pid, *descendants(proc.pid)]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    return Held(proc.returncode, "".join(out), holds, seen)


def hold_all_then_one(cmd: Sequence[str], *, hold: str, ranks: int, first: int, until: Callable[[str], bool],
                      env: dict | None = None, cwd: Path | None = None, timeout: float = 240) -> Held:
    """Run ``cmd`` (a torchrun launch of ``ranks`` ranks) with ``FGDATA_TEST_HOLD=hold`` (a point every rank
    reaches). Once every rank is held there, release rank ``first`` alone; once ``until`` accepts a line (what
    that rank did on its own), release the others; then wait for the launch to end."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env={**os.environ, **(env or {}), "FGDATA_TEST_HOLD": hold},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    held: dict[int, int] = {}  # rank -> pid
    seen: str | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if HELD_MARK in line:
                held.update((int(rank), int(pid)) for rank, pid in re.findall(r"rank (\d+), pid (\d+)", line))
                if len(held) == ranks:
                    os.kill(held[first], signal.SIGUSR1)
            elif len(held) == ranks and until(line):
                seen = line
                for rank, pid in held.items():
                    if rank != first:
                        os.kill(pid, signal.SIGUSR1)
                break
        else:
            raise AssertionError(f"the launch ended before its holds and the awaited line: {''.join(out)[-3000:]}")
        out.append(proc.stdout.read())  # the stream's own buffer first (communicate() would skip it)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:  # torchrun starts each rank in its own session: kill them by pid
            for pid in [proc.pid, *descendants(proc.pid)]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    return Held(proc.returncode, "".join(out), [line for line in out if HELD_MARK in line], seen or "")


@dataclass
class WorkerKilled:
    returncode: int
    stderr: str
    worker: int  # the pid of the worker that was killed
    siblings: list[int]  # the pool's other workers (same parent) when it was killed


def kill_worker_with_result(cmd: Sequence[str], *, env: dict | None = None, cwd: Path | None = None,
                            timeout: float = 240) -> WorkerKilled:
    """Run ``cmd`` with its pool workers held where each has a result in hand, not yet sent
    (``FGDATA_TEST_HOLD=worker-result``); SIGKILL the first worker that says so, as the system's out-of-memory
    killer would, then wait for the command to end (``timeout`` only bounds a hang, which fails the test)."""
    env = {**os.environ, **(env or {}), "FGDATA_TEST_HOLD": "worker-result"}
    with _paused_at(cmd, env, cwd, HELD_MARK, timeout, "a worker held") as (proc, lines):
        worker = int(re.findall(r"pid (\d+)", lines[-1])[0])
        parent = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
        siblings = [p for p in descendants(parent) if p != worker]
        os.kill(worker, signal.SIGKILL)
        rest = proc.stderr.read()
        proc.wait(timeout=timeout)
    return WorkerKilled(proc.returncode, "".join(lines) + rest, worker, siblings)


# -- S3 endpoints that misbehave ------------------------------------------------


class LoopbackProxy:
    """A TCP server on a free loopback port (``url``) in front of the S3 endpoint ``upstream`` (``http://host:port``,
    or None for none): every connection it accepts goes to :meth:`handle` on a thread of its own, until
    :meth:`close`. Each S3 fault test says only what its proxy does to a connection."""

    def __init__(self, upstream: str | None):
        self.upstream: tuple[str, int] | None = None
        if upstream:
            host, port = upstream.removeprefix("http://").split(":")
            self.upstream = (host, int(port))
        self._stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.handle, args=(client,), daemon=True).start()

    def handle(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


Proxy = TypeVar("Proxy", bound=LoopbackProxy)


@contextlib.contextmanager
def s3_through(proxy: Proxy, monkeypatch: Any) -> Iterator[Proxy]:
    """This process's S3 calls (and the s5cmd it starts) go through ``proxy`` inside the block; closed after it."""
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.url)
    try:
        yield proxy
    finally:
        proxy.close()

"""URL list -> shards: fgdata vs img2dataset against the same loopback HTTP server and manifest.

The server (a separate process, http.server with threads, bound to 127.0.0.1) serves JPEGs of
256x256 under /img/N.jpg, optionally after a latency drawn per URL (seeded) from each case of
--latency-ms (``20-50``: uniform between 20 and 50 ms; ``0``: none). Both tools get the same
Parquet manifest (url, caption), the same number of processes and requests in flight per process,
the same timeouts (10 s to connect and between bytes), no retries, and keep the original bytes
(fgdata's default; img2dataset with ``--resize_mode no --disable_all_reencoding True``, in which
it does not decode the image at all, while fgdata reads its size).

Each case runs --repeats rounds, the two tools alternating which goes first, and reports each
tool's median round. Per tool and round: images/s (wall clock of the whole command), CPU seconds
per image (user + system of the command and every process it waited for), the peak memory of its
whole process tree (the sum of its processes' PSS, sampled every 0.1 s; PSS counts a page shared
by N processes as 1/N in each) and the peak RSS of its largest process, and its success count,
checked against the samples its shards hold (fgdata's also against written + failed = URLs).

img2dataset runs from its own environment: ``--img2dataset PATH`` names the ``img2dataset``
executable of a venv where ``pip install img2dataset`` put it; without it, only fgdata runs.

    python benchmarks/bench_download.py --images 20000 --latency-ms 0,20-50 --repeats 2 \\
        --processes 2 --img2dataset /tmp/i2d-venv/bin/img2dataset
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

DISTINCT = 256  # distinct images served; URL N gets image N mod DISTINCT
TIMEOUT_S = 10  # img2dataset's default socket timeout, given to fgdata as its connect and stall timeouts
SAMPLE_EVERY_S = 0.1


def _images() -> list[bytes]:
    from PIL import Image

    rng = random.Random(0)
    out = []
    for _ in range(DISTINCT):
        noise = rng.randbytes(64 * 64 * 3)
        im = Image.frombytes("RGB", (64, 64), noise).resize((256, 256), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def serve(port_file: str, latency_ms: str) -> None:
    """Run the image server until killed; write its port to ``port_file`` once listening.

    asyncio on raw streams rather than http.server: the server shares the machine's cores with the
    tool under test, so it should spend as little CPU per request as it can (keep-alive honoured,
    ``Connection: close`` too, which img2dataset's urllib sends).
    """
    import asyncio

    images = _images()
    lo, _, hi = latency_ms.partition("-")
    low, high = float(lo) / 1000, float(hi or lo) / 1000

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, headers = head.partition(b"\r\n")
                path = request_line.split(b" ")[1].decode()
                n = int(path.rsplit("/", 1)[1].split(".")[0])
                if high > 0:
                    await asyncio.sleep(random.Random(n).uniform(low, high))
                body = images[n % DISTINCT]
                close = b"connection: close" in headers.lower()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n%s\r\n"
                             % (len(body), b"Connection: close\r\n" if close else b"") + body)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        Path(port_file + ".tmp").write_text(str(server.sockets[0].getsockname()[1]))
        os.replace(port_file + ".tmp", port_file)
        await asyncio.Event().wait()

    asyncio.run(main())


def _manifest(path: Path, base: str, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    urls = [f"{base}/img/{i}.jpg" for i in range(n)]
    pq.write_table(pa.table({"url": urls, "caption": [f"image {i}" for i in range(n)]}), path)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:  # ended meanwhile
            pass
    return found


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_measured(result_file: str, cmd: list[str]) -> None:
    """Run ``cmd`` as this (fresh) process's only child and write its wall time, CPU and memory as JSON.

    A fresh process, because RUSAGE_CHILDREN's peak RSS is a maximum over every child ever waited for.
    It is a child subreaper and reaps every orphan before reading RUSAGE_CHILDREN: a forkserver
    (fgdata's workers start from one) is never waited for by the process that started it, and
    without this its workers' CPU would be lost.
    """
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_tree_kib = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree_kib
        while not done.wait(SAMPLE_EVERY_S):
            tree = _tree(os.getpid())[1:]  # the command, its descendants and orphans now ours, not this process
            peak_tree_kib = max(peak_tree_kib, sum(_pss_kib(p) for p in tree))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = child.communicate()
    wall = time.perf_counter() - start
    while True:  # orphans (a forkserver) end once the command has: reap them, so their CPU counts
        try:
            os.wait()
        except ChildProcessError:
            break
    done.set()
    sampler.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(result_file).write_text(json.dumps({
        "returncode": child.returncode, "stderr": stderr[-2000:], "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime, "largest_rss_mib": usage.ru_maxrss / 1024,
        "tree_pss_mib": peak_tree_kib / 1024}))


def _measure(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, __file__, "--measure", f.name, "--", *cmd], env=env, check=True)
        result = json.loads(Path(f.name).read_text())
    if result["returncode"] != 0:
        raise SystemExit(f"{cmd[0]} failed ({result['returncode']}): {result['stderr']}")
    return {k: result[k] for k in ("wall_s", "cpu_s", "largest_rss_mib", "tree_pss_mib")}


def _images_in_shards(out: Path) -> int:
    """Samples with a .jpg member in the tar shards under ``out`` (both tools name the image so)."""
    total = 0
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            total += sum(1 for m in tar if m.name.endswith(".jpg"))
    return total


def _fgdata(manifest: Path, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "fgdata", "shard", "images", str(manifest), str(out), "--path-column", "url",
           "--workers", str(args.processes), "--fetch-threads", str(args.threads), "--per-host", str(args.threads),
           "--connect-timeout", str(TIMEOUT_S), "--stall-timeout", str(TIMEOUT_S),
           "--maxcount", "1000", "--retries", "0", "--allow-private-network", "-q"]  # the server is on loopback
    result = _measure(cmd, dict(os.environ))
    report = json.loads((out / "failures.json").read_text())
    if report["seen"] != args.images or report["written"] + report["failed"] != args.images:
        raise SystemExit(f"fgdata accounted for {report['seen']} URLs ({report['written']} written, "
                         f"{report['failed']} failed) of {args.images}")
    in_shards = _images_in_shards(out)
    if in_shards != report["written"]:
        raise SystemExit(f"fgdata reports {report['written']} written, its shards hold {in_shards}")
    return {**result, "successes": report["written"], "failures": report.get("failed_by_reason", {})}


def _img2dataset(exe: str, manifest: Path, out: Path, args: argparse.Namespace) -> dict:
    cmd = [exe, "--url_list", str(manifest), "--input_format", "parquet", "--url_col", "url",
           "--caption_col", "caption", "--output_format", "webdataset", "--output_folder", str(out),
           "--processes_count", str(args.processes), "--thread_count", str(args.threads),
           "--timeout", str(TIMEOUT_S), "--number_sample_per_shard", "1000", "--resize_mode", "no",
           "--disable_all_reencoding", "True", "--distributor", "multiprocessing", "--retries", "0",
           "--enable_wandb", "False"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_ALBUMENTATIONS_UPDATE"] = "1"  # no version check over the network at each start
    result = _measure(cmd, env)
    stats = [json.loads(p.read_text()) for p in out.glob("*_stats.json")]
    successes = sum(s["successes"] for s in stats)
    failures: dict[str, int] = {}
    for s in stats:
        for reason, n in s.get("status_dict", {}).items():
            if reason != "success":
                failures[reason] = failures.get(reason, 0) + n
    in_shards = _images_in_shards(out)
    if in_shards != successes:
        raise SystemExit(f"img2dataset reports {successes} successes, its shards hold {in_shards}")
    return {**result, "successes": successes, "failures": failures}


def _case(latency_ms: str, work: Path, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Serve with this latency; run --repeats rounds of both tools, alternating who goes first."""
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), "--latency-ms", latency_ms])
    runs: dict[str, list[dict]] = {"fgdata": [], "img2dataset": []}
    try:
        while not port_file.exists():
            if server.poll() is not None:
                raise SystemExit("the image server did not start")
            time.sleep(0.05)
        manifest = work / "urls.parquet"
        _manifest(manifest, f"http://127.0.0.1:{port_file.read_text()}", args.images)
        tools = ["fgdata", "img2dataset"] if args.img2dataset else ["fgdata"]
        for round_no in range(args.repeats):
            for tool in tools if round_no % 2 == 0 else tools[::-1]:
                out = work / tool
                shutil.rmtree(out, ignore_errors=True)
                server_cpu = _cpu_s(server.pid)
                r = (_fgdata(manifest, out, args) if tool == "fgdata"
                     else _img2dataset(args.img2dataset, manifest, out, args))
                r["server_cpu_s"] = _cpu_s(server.pid) - server_cpu
                shutil.rmtree(out, ignore_errors=True)
                runs[tool].append(r)
                print(f"  [{latency_ms} ms, round {round_no + 1}] {_line(tool, r, args.images)}", flush=True)
    finally:
        server.kill()
        server.wait()
    return {tool: r for tool, r in runs.items() if r}


def _line(tool: str, r: dict, images: int) -> str:
    failed = f"  failures {r['failures']}" if r["failures"] else ""
    return (f"{tool:12s} {images / r['wall_s']:7.0f} img/s  {1000 * r['cpu_s'] / images:5.2f} ms CPU/img  "
            f"(server {1000 * r['server_cpu_s'] / images:4.2f})  tree PSS {r['tree_pss_mib']:5.0f} MiB  largest RSS {r['largest_rss_mib']:4.0f} MiB  "
            f"successes {int(r['successes']):,}{failed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--latency-ms", default="0,20-50",
                        help="comma-separated cases of per-request latency: LOW-HIGH ms, or 0")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per case (median reported)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=32, help="requests in flight per process (both tools)")
    parser.add_argument("--img2dataset", help="the img2dataset executable of its own venv (omit: fgdata only)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _run_measured(args.measure, args.command)
        return
    if args.serve:
        serve(args.serve, args.latency_ms)
        return
    work = Path(tempfile.mkdtemp(prefix="fgdata-bench-download-"))
    print(f"{args.images:,} images, {args.processes} processes x {args.threads} requests in flight, "
          f"{args.repeats} rounds per case, load average {os.getloadavg()[0]:.1f}", flush=True)
    try:
        cases = {latency: _case(latency, work, args) for latency in args.latency_ms.split(",")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians over {args.repeats} rounds (load average now {os.getloadavg()[0]:.1f}):")
    for latency, runs in cases.items():
        medians = {tool: {k: statistics.median(r[k] for r in rs) if k != "failures" else rs[0][k] for k in rs[0]}
                   for tool, rs in runs.items()}
        print(f" latency {latency} ms")
        for tool, r in medians.items():
            print(f"  {_line(tool, r, args.images)}")
        if "img2dataset" in medians:
            fg, i2d = medians["fgdata"], medians["img2dataset"]
            print(f"  fgdata / img2dataset: images/s {i2d['wall_s'] / fg['wall_s']:.2f}x, "
                  f"CPU per image {fg['cpu_s'] / i2d['cpu_s']:.2f}x, tree PSS {fg['tree_pss_mib'] / i2d['tree_pss_mib']:.2f}x, "
                  f"successes {'equal' if fg['successes'] == i2d['successes'] else 'DIFFER'}")


if __name__ == "__main__":
    main()

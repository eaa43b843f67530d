"""URL list -> shards: fgdata vs img2dataset against the same loopback HTTP server and manifest.

The server (a separate process, http.server with threads, bound to 127.0.0.1) serves JPEGs of
256x256 under /img/N.jpg, optionally after a latency drawn per URL (seeded) from --latency-ms
(``20-50``: uniform between 20 and 50 ms; ``0``: none). Both tools get the same Parquet manifest
(url, caption), the same number of processes and threads per process, and keep the original
bytes (fgdata's default; img2dataset with ``--resize_mode no --disable_all_reencoding True``).

Reported per tool: images/s (wall clock of the whole command), CPU seconds per image (user +
system of the command and every process it waited for), the peak RSS of its largest process
(each tool is measured from its own fresh parent),
and its success count. img2dataset runs from its own environment: ``--img2dataset PATH`` names
the ``img2dataset`` executable of a venv where ``pip install img2dataset`` put it; without it,
only fgdata runs.

    python benchmarks/bench_download.py --images 20000 --latency-ms 20-50 --processes 2 \\
        --img2dataset /tmp/i2d-venv/bin/img2dataset
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DISTINCT = 256  # distinct images served; URL N gets image N mod DISTINCT


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
    """Run the image server until killed; write its port to ``port_file`` once listening."""
    images = _images()
    lo, _, hi = latency_ms.partition("-")
    low, high = float(lo) / 1000, float(hi or lo) / 1000

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            n = int(self.path.rsplit("/", 1)[1].split(".")[0])
            if high > 0:
                time.sleep(random.Random(n).uniform(low, high))
            body = images[n % DISTINCT]
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    httpd = Server(("127.0.0.1", 0), Handler)
    Path(port_file + ".tmp").write_text(str(httpd.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    threading.Event().wait()


def _manifest(path: Path, base: str, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    urls = [f"{base}/img/{i}.jpg" for i in range(n)]
    pq.write_table(pa.table({"url": urls, "caption": [f"image {i}" for i in range(n)]}), path)


def _run_measured(result_file: str, cmd: list[str]) -> None:
    """Run ``cmd`` as this (fresh) process's only child and write its wall time, CPU and peak RSS as JSON.

    A fresh process, because RUSAGE_CHILDREN's peak RSS is a maximum over every child ever waited for.
    """
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(result_file).write_text(json.dumps({
        "returncode": done.returncode, "stderr": done.stderr[-2000:], "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}))


def _measure(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, __file__, "--measure", f.name, "--", *cmd], env=env, check=True)
        result = json.loads(Path(f.name).read_text())
    if result["returncode"] != 0:
        raise SystemExit(f"{cmd[0]} failed ({result['returncode']}): {result['stderr']}")
    return {k: result[k] for k in ("wall_s", "cpu_s", "peak_rss_mib")}


def _fgdata(manifest: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "fgdata", "shard", "images", str(manifest), str(out), "--path-column", "url",
           "--workers", str(args.processes), "--fetch-threads", str(args.threads), "--per-host", str(args.threads),
           "--maxcount", "1000", "--retries", "0", "-q"]
    result = _measure(cmd, dict(os.environ))
    report = json.loads((out / "failures.json").read_text())
    return {**result, "successes": report["written"]}


def _img2dataset(exe: str, manifest: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [exe, "--url_list", str(manifest), "--input_format", "parquet", "--url_col", "url",
           "--caption_col", "caption", "--output_format", "webdataset", "--output_folder", str(out),
           "--processes_count", str(args.processes), "--thread_count", str(args.threads),
           "--number_sample_per_shard", "1000", "--resize_mode", "no", "--disable_all_reencoding", "True",
           "--distributor", "multiprocessing", "--retries", "0", "--enable_wandb", "False"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = _measure(cmd, env)
    successes = sum(json.loads(p.read_text())["successes"] for p in out.glob("*_stats.json"))
    return {**result, "successes": successes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--latency-ms", default="20-50", help="per-request latency: LOW-HIGH ms, or 0")
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
    port_file = work / "port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), "--latency-ms", args.latency_ms])
    try:
        while not port_file.exists():
            if server.poll() is not None:
                raise SystemExit("the image server did not start")
            time.sleep(0.05)
        manifest = work / "urls.parquet"
        _manifest(manifest, f"http://127.0.0.1:{port_file.read_text()}", args.images)
        results = {"fgdata": _fgdata(manifest, work / "fgdata", args)}
        if args.img2dataset:
            results["img2dataset"] = _img2dataset(args.img2dataset, manifest, work / "i2d", args)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.images:,} images, latency {args.latency_ms} ms, {args.processes} processes x {args.threads} threads")
    for tool, r in results.items():
        print(f"  {tool:12s} {args.images / r['wall_s']:8.0f} img/s  {1000 * r['cpu_s'] / args.images:6.2f} ms CPU/img  "
              f"peak RSS {r['peak_rss_mib']:6.0f} MiB  successes {int(r['successes']):,}")
    if "img2dataset" in results:
        ratio = results["img2dataset"]["wall_s"] / results["fgdata"]["wall_s"]
        print(f"  fgdata / img2dataset images/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()

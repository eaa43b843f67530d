"""The downloader's HTTP client: fgdata's own fetch against urllib3 2.x and aiohttp, one process each.

All fetch the same URLs from bench_download.py's loopback server (a separate asyncio process serving
~30 KB JPEGs, with a latency drawn per URL), with the same number of requests in flight, kept-alive
connections and the whole body read into memory; each client runs in its own process and reports
requests/s and CPU per request (user + system of that process). fgdata's row is the code a worker runs
(:func:`fgdata.storage.http.fetch` on a thread pool, the network policy on: the server is reached with
``FGDATA_ALLOW_PRIVATE_NETWORK=1`` but every address is still classified); urllib3's is a ``PoolManager``
on the same thread pool (the library the client could be built on); aiohttp's is an asyncio client.
``--baseline PATH`` adds a row for fgdata's fetch from another checkout (e.g. before a change).
aiohttp is not a dependency of fgdata: its row runs only where it is installed.

    python benchmarks/bench_fetch.py --urls 5000 --in-flight 64 --latency-ms 0,20-50 --baseline /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_THREADS = r"""
import json, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from fgdata.storage import http
base, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
http.configure(http.DownloadOptions(threads=k, per_host=k, retries=0, connect_timeout=10, stall_timeout=10))
urls = [f"{base}/img/{i}.jpg" for i in range(n)]
c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
with ThreadPoolExecutor(k) as pool:
    size = sum(len(body) for _, body, _ in pool.map(http.fetch, urls))
c1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
print(json.dumps({"wall": wall, "cpu": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, "bytes": size}))
"""

_URLLIB3 = r"""
import json, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
import urllib3
base, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pool = urllib3.PoolManager(maxsize=k, block=True, retries=False, timeout=urllib3.Timeout(connect=10, read=10))
urls = [f"{base}/img/{i}.jpg" for i in range(n)]

def get(url):
    return pool.request("GET", url, headers={"User-Agent": "bench"}).data

c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
with ThreadPoolExecutor(k) as workers:
    size = sum(len(body) for body in workers.map(get, urls))
c1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
print(json.dumps({"wall": wall, "cpu": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, "bytes": size}))
"""

_AIOHTTP = r"""
import asyncio, json, resource, sys, time
import aiohttp
base, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    sizes = []
    timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=k, limit_per_host=k),
                                     timeout=timeout) as session:
        todo = iter(range(n))

        async def worker():
            for i in todo:
                async with session.get(f"{base}/img/{i}.jpg") as response:
                    sizes.append(len(await response.read()))

        await asyncio.gather(*(worker() for _ in range(k)))
    return sum(sizes)

c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
size = asyncio.run(main())
c1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
print(json.dumps({"wall": wall, "cpu": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, "bytes": size}))
"""


def _client(code: str, base: str, urls: int, in_flight: int, path: Path = HERE.parent) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path), "FGDATA_ALLOW_PRIVATE_NETWORK": "1"}
    done = subprocess.run([sys.executable, "-c", code, base, str(urls), str(in_flight)], capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"client failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--urls", type=int, default=5000)
    ap.add_argument("--in-flight", default="32,64", help="requests in flight, comma-separated")
    ap.add_argument("--latency-ms", default="0,20-50", help="server latency cases, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another fgdata checkout whose fetch gets a row too")
    args = ap.parse_args()
    clients = {"fgdata": (_THREADS, HERE.parent), "urllib3": (_URLLIB3, HERE.parent)}
    if args.baseline:
        clients[f"fgdata ({args.baseline})"] = (_THREADS, args.baseline.resolve())
    try:
        import aiohttp  # noqa: F401 - its row only where it is installed
        clients["aiohttp"] = (_AIOHTTP, HERE.parent)
    except ImportError:
        print("aiohttp is not installed: no aiohttp row")
    print(f"{args.urls:,} URLs per run, {args.repeats} rounds (median), load average {os.getloadavg()[0]:.1f}")
    print("| latency | in flight | client | requests/s | CPU ms / request |")
    print("|---|---:|---|---:|---:|")
    work = Path(os.environ.get("TMPDIR", "/tmp"))
    for latency in args.latency_ms.split(","):
        port_file = work / f"fgdata-bench-fetch-{os.getpid()}.port"
        port_file.unlink(missing_ok=True)
        server = subprocess.Popen([sys.executable, str(HERE / "bench_download.py"), "--serve", str(port_file),
                                   "--latency-ms", latency])
        try:
            while not port_file.exists():
                time.sleep(0.05)
            base = f"http://127.0.0.1:{port_file.read_text()}"
            for k in (int(x) for x in args.in_flight.split(",")):
                rows: dict[str, list[dict]] = {name: [] for name in clients}
                for round_no in range(args.repeats):  # alternate which goes first
                    order = list(clients.items())
                    for name, (code, path) in order if round_no % 2 == 0 else order[::-1]:
                        rows[name].append(_client(code, base, args.urls, k, path))
                for name, runs in rows.items():
                    rate = statistics.median(args.urls / r["wall"] for r in runs)
                    cpu = statistics.median(r["cpu"] / args.urls * 1e3 for r in runs)
                    print(f"| {latency} ms | {k} | {name} | {rate:,.0f} | {cpu:.3f} |", flush=True)
        finally:
            server.kill()
            server.wait()
            port_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

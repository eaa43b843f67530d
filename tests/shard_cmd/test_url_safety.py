"""What a list of URLs may not do: leave its credentials in a file or a message, or pick files off this machine.

A loopback server (127.0.0.1, started by the test) serves the manifests and images.

Secrets: the manifest's own URL is signed, and its images' URLs carry userinfo, presigned-S3 parameters,
tokens, an API key and a parameter named by ``FGDATA_REDACT_PARAMS``; one redirects to an ftp:// URL with
credentials (a failure whose reason quotes it). The real CLI runs in a subprocess (``shard``, a resumed
``shard --json``, ``inspect``, ``verify``, ``report``), on a local DST and on the loopback S3, with S3
credentials of its own: no secret may appear in any file below DST (``.fgdata`` included; every object of the
bucket listed and read), in the report page, or in any output.

Local files: a manifest served over http or stored on S3 whose rows name a local file (an absolute path, a
``file://`` URL) has those rows fail with reason ``local-path``, the file never read, unless
``--allow-local-paths``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faultkit import png_bytes, run_cli

pytestmark = pytest.mark.timeout(600)

SECRETS = {
    "password": "PASSWORDSECRET1",
    "signature": "SIGSECRET2",
    "credential": "CREDSECRET3",
    "token": "TOKENSECRET4",
    "api-key": "APIKEYSECRET5",
    "manifest": "MANIFESTSECRET6",
    "custom": "CUSTOMSECRET7",
    "redirect": "REDIRSECRET8",
    "aws-key-id": "AKIAURLSECRETS00TEST",
    "aws-secret": "AWSSECRETACCESSKEY9",
}
PRESIGNED = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={c}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
             "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-Signature={s}&X-Amz-Security-Token={t}")


class Server:
    """Images at /img/N.png (any query), manifests by name, a redirect to ftp:// with credentials, 404 else.
    Records every request target, so the test can tell that the fetch used the URL as given."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.files: dict[str, bytes] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server.targets.append(self.path)
                path = self.path.split("?", 1)[0]
                status, headers, body = 404, {}, b""
                if path.startswith("/img/"):
                    status, body = 200, png_bytes(int(path[5:].split(".")[0]))
                elif path in server.files:
                    status, body = 200, server.files[path]
                elif path == "/moved.png":
                    status = 302
                    headers = {"Location": f"ftp://carol:{SECRETS['redirect']}@example.invalid/x.png"
                                           f"?sig={SECRETS['redirect']}"}
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    thread = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def _rows(base: str, signature: str) -> list[tuple[str, str]]:
    """(URL as the manifest gives it, as fgdata must store it) for every row."""
    s = SECRETS
    host = base.removeprefix("http://")
    presigned = PRESIGNED.format(c=s["credential"], s=signature, t=s["token"])
    stored = PRESIGNED.format(c="REDACTED", s="REDACTED", t="REDACTED").replace(
        "REDACTED%2F20260101%2Fus-east-1%2Fs3%2Faws4_request", "REDACTED")  # the whole value goes
    return [
        (f"http://alice:{s['password']}@{host}/img/1.png", f"{base}/img/1.png"),
        (f"{base}/img/2.png?{presigned}", f"{base}/img/2.png?{stored}"),
        (f"{base}/img/3.png?token={s['token']}&key={s['api-key']}&size=big",
         f"{base}/img/3.png?token=REDACTED&key=REDACTED&size=big"),
        (f"{base}/img/4.png?mysig={s['custom']}", f"{base}/img/4.png?mysig=REDACTED"),
        (f"img/5.png?access_token={s['token']}", "img/5.png?access_token=REDACTED"),  # relative to the manifest
        (f"http://bob:{s['password']}@{host}/missing.png?sig={signature}", f"{base}/missing.png?sig=REDACTED"),
        (f"{base}/moved.png?Signature={signature}", f"{base}/moved.png?Signature=REDACTED"),
    ]


def _serve_manifest(server: Server, name: str, signature: str) -> str:
    lines = ["url,caption"] + [f"{url},row {i}" for i, (url, _) in enumerate(_rows(server.url, signature))]
    server.files[f"/{name}"] = ("\n".join(lines) + "\n").encode()
    return f"{server.url}/{name}?Signature={SECRETS['manifest']}&X-Amz-Credential={SECRETS['credential']}"


def _env(tmp_path: Path) -> dict[str, str]:
    return {"FGDATA_REDACT_PARAMS": "mysig", "FGDATA_ALLOW_PRIVATE_NETWORK": "1",
            "AWS_ACCESS_KEY_ID": SECRETS["aws-key-id"], "AWS_SECRET_ACCESS_KEY": SECRETS["aws-secret"],
            "FGDATA_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1", "COLUMNS": "250"}


def _assert_clean(where: str, data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    found = {name: raw.find(secret.encode()) for name, secret in SECRETS.items() if secret.encode() in raw}
    assert not found, f"{where} holds {sorted(found)}: {raw[max(0, min(found.values()) - 300):][:600]!r}"


def _run(*args: object, env: dict[str, str], expect: int | None = 0) -> str:
    proc = run_cli(*map(str, args), env=env, timeout=240)
    out = proc.stdout + proc.stderr
    _assert_clean(f"output of {' '.join(map(str, args[:2]))}", out)
    assert "Traceback" not in out, out[-3000:]
    if expect is not None:
        assert proc.returncode == expect, out[-3000:]
    return proc.stdout


def _objects(s3_endpoint: str, prefix: str) -> dict[str, bytes]:
    """Every object below ``s3://bucket/key``, listed and read with boto3, by its name below the prefix."""
    import boto3

    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for obj in page.get("Contents", []):
            name = obj["Key"].removeprefix(key.rstrip("/") + "/")
            found[name] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return found


def _sources(shard_files: dict[str, bytes]) -> list[str]:
    import io
    import tarfile

    sources = []
    for name in sorted(n for n in shard_files if n.endswith(".tar")):
        with tarfile.open(fileobj=io.BytesIO(shard_files[name])) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    sources.append(json.loads(tar.extractfile(member).read())["fgdata"]["source"])
    return sources


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.slow  # end to end, several seconds
def test_no_secret_of_a_url_is_written_or_printed(server, tmp_path, where, request, monkeypatch):
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")  # loopback inputs once the network policy is in
    env = _env(tmp_path)
    manifest = _serve_manifest(server, "list.csv", SECRETS["signature"])
    dest: str = str(tmp_path / "out")
    if where == "s3":
        dest = request.getfixturevalue("s3_bucket") + "/out"
    printed = _run("shard", "images", manifest, dest, "--path-column", "url", "--format", "keep",
                   "--maxcount", "3", "--retries", "0", env=env)
    assert "Signature=REDACTED" in printed  # the summary names the manifest, redacted

    # the fetches used the URLs as given (query and all): only what is stored is redacted
    assert any(SECRETS["signature"] in t for t in server.targets)
    assert any(SECRETS["custom"] in t for t in server.targets)

    # a rerun of the same list signed again is the same input: everything resumes, nothing is fetched again
    server.targets.clear()
    again = _serve_manifest(server, "list-resigned.csv", "SIGNEDAGAIN")
    doc = json.loads(_run("shard", "images", again, dest, "--path-column", "url", "--format", "keep",
                          "--maxcount", "3", "--retries", "0", "--json", env=env))
    assert doc["resumed"] == doc["seen"] == 7 and doc["changed_inputs"] == []
    assert [t.split("?")[0] for t in server.targets] == ["/list-resigned.csv"]

    _run("inspect", dest, "--limit", "10", env=env)
    _run("inspect", dest, "--key", "sample_000001", env=env)
    _run("inspect", dest, "--json", env=env)
    _run("verify", dest, env=env, expect=None)
    _run("verify", dest, "--json", env=env, expect=None)
    page = tmp_path / "report.html"
    _run("report", dest, "-o", page, "--sample", "10", env=env, expect=None)
    _assert_clean("report.html", page.read_bytes())

    if where == "s3":
        files = _objects(request.getfixturevalue("s3_endpoint"), dest)
    else:
        files = {p.relative_to(dest).as_posix(): p.read_bytes() for p in Path(dest).rglob("*") if p.is_file()}
    assert any(name.startswith(".fgdata/units/") for name in files)  # the unit records were looked at
    for name, data in files.items():
        _assert_clean(name, data)

    stored = [stored for _, stored in _rows(server.url, SECRETS["signature"])]
    assert _sources(files) == stored[:5]  # each sample names its input, credentials redacted
    report = json.loads(files["failures.json"])
    assert [f["input"] for f in report["failures"]] == stored[5:]
    assert report["failures"][0]["reason"] == "http: status 404"
    assert report["failures"][1]["reason"].startswith("redirect: ")


# -- a remote manifest names local files -----------------------------------------------------------------------


def _local_rows(private: Path) -> list[str]:
    return [str(private), private.as_uri(), "file://localhost" + private.as_posix()]


def _write_table(rows: list[dict[str, str]], fmt: str) -> bytes:
    if fmt == "csv":
        return ("path,caption\n" + "".join(f"{r['path']},{r['caption']}\n" for r in rows)).encode()
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _tree_bytes(dest: str, s3_endpoint: str | None) -> dict[str, bytes]:
    if s3_endpoint is not None:
        return _objects(s3_endpoint, dest)
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in Path(dest).rglob("*") if p.is_file()}


@pytest.mark.parametrize(("where", "fmt"), [("http", "csv"), ("http", "parquet"), ("s3", "jsonl")])
@pytest.mark.slow  # end to end, several seconds
def test_a_remote_manifest_cannot_read_local_files(cli, server, sample_images, tmp_path, monkeypatch, request,
                                                   where, fmt):
    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")  # loopback inputs once the network policy is in
    monkeypatch.setenv("FGDATA_CACHE", str(tmp_path / "cache"))
    private = tmp_path / "home" / "user" / "private_photo.jpg"
    private.parent.mkdir(parents=True)
    private.write_bytes(next(p for p in sample_images if p.suffix == ".jpg").read_bytes())  # kept byte for byte
    secret_bytes = private.read_bytes()
    paths = _local_rows(private) + [f"{server.url}/img/1.png", "pics/2.png"]  # the last relative to the manifest
    table = _write_table([{"path": p, "caption": f"row {i}"} for i, p in enumerate(paths)], fmt)
    endpoint = None
    if where == "http":
        server.files[f"/lists/m.{fmt}"] = table
        server.files["/lists/pics/2.png"] = png_bytes(2)
        manifest, dest = f"{server.url}/lists/m.{fmt}", str(tmp_path / "out")
    else:
        import boto3

        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = request.getfixturevalue("s3_bucket")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.put_object(Bucket=bucket[5:], Key=f"lists/m.{fmt}", Body=table)
        client.put_object(Bucket=bucket[5:], Key="lists/pics/2.png", Body=png_bytes(2))
        manifest, dest = f"{bucket}/lists/m.{fmt}", f"{bucket}/out"

    cli("shard", "images", manifest, dest, "-q")
    files = _tree_bytes(dest, endpoint)
    for name, data in files.items():
        assert secret_bytes not in data, name
    report = json.loads(files["failures.json"])
    assert (report["seen"], report["written"], report["failed_by_reason"]) == (5, 2, {"local-path": 3})
    assert [(f["index"], f["input"]) for f in report["failures"]] == list(enumerate(_local_rows(private)))
    scheme = manifest.partition(":")[0]
    for f in report["failures"]:
        assert f["reason"] == (f"local-path: row {f['index']} of m.{fmt} names a local file, but the manifest was "
                               f"read from {scheme}://: its rows must be URLs (--allow-local-paths reads local files)")

    # the flag reads them (a rerun with it writes again the units that hold them)
    cli("shard", "images", manifest, dest, "-q", "--allow-local-paths")
    files = _tree_bytes(dest, endpoint)
    report = json.loads(files["failures.json"])
    assert (report["written"], report["failed"]) == (5, 0)
    assert sum(data.count(secret_bytes) for name, data in files.items() if name.endswith(".tar")) == 3


def test_a_local_manifest_reads_absolute_paths_and_file_urls(cli, sample_images, tmp_path):
    """The rule for a local manifest: paths relative to its folder, absolute paths and file:// URLs all read."""
    src = tmp_path / "lists"
    (src / "pics").mkdir(parents=True)
    photo = sample_images[0]
    (src / "pics" / photo.name).write_bytes(photo.read_bytes())
    elsewhere = tmp_path / "elsewhere" / "a b.jpg"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(photo.read_bytes())
    rows = [f"pics/{photo.name}", str(elsewhere), elsewhere.as_uri(), "file://fileserver/share/x.jpg", "ftp://h/x.jpg"]
    (src / "m.csv").write_text("path\n" + "".join(f"{r}\n" for r in rows))
    cli("shard", "images", src / "m.csv", tmp_path / "out", "-q", expect=0)
    report = json.loads((tmp_path / "out" / "failures.json").read_text())
    assert report["written"] == 3
    assert [(f["input"], f["reason"]) for f in report["failures"]] == [
        ("file://fileserver/share/x.jpg", "path: row 3 of m.csv: a file:// URL of another host"),
        ("ftp://h/x.jpg", "path: row 4 of m.csv: ftp:// is not a scheme fgdata reads"),
    ]

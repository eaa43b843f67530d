"""Credentials in URLs never reach a file fgdata writes or a line it prints.

A loopback server (127.0.0.1, started by the test) serves a manifest whose own URL is signed, and images whose
URLs carry userinfo, presigned-S3 parameters, tokens, an API key and a parameter named by
``FGDATA_REDACT_PARAMS``; one redirects to an ftp:// URL with credentials (a failure whose reason quotes it). The
real CLI runs in a subprocess (``shard``, a resumed ``shard --json``, ``inspect``, ``verify``, ``report``), on a
local DST and on the loopback S3, with S3 credentials of its own: no secret may appear in any file below DST
(``.fgdata`` included; every object of the bucket listed and read), in the report page, or in any output.
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

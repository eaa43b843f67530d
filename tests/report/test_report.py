"""`fgdata report` on image, video+audio, latent and prompt shards, and on shards webdataset wrote: the page is
one self-contained HTML file whose pictures all decode, and its counts are count-shards' counts."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fgdata import __version__
from fgdata.shards import ShardWriter, iter_samples, require_shards
from inprocess import fgdata


def fg(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``fgdata ARGS`` in this process (what is tested is the command's output and exit status)."""
    return fgdata(*args, env={"COLUMNS": "100"}, cwd=cwd)


class _Page(HTMLParser):
    """Collects every reference to something outside the page, and every image."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag in ("script", "link", "iframe", "object", "embed", "video", "audio", "source"):
            self.external.append(f"<{tag}>")
        for name in ("href", "src"):
            value = a.get(name) or ""
            if value and not value.startswith(("#", "data:")):
                self.external.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_page(path: Path) -> _Page:
    """The page parses, refers to nothing outside itself, and every image is a non-empty PNG that decodes."""
    import base64

    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    assert page.tags[:2] == ["html", "head"] and "body" in page.tags
    assert not page.external, page.external
    assert page.images
    for src in page.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "PNG" and im.width > 8 and im.height > 8
            im.load()
            extrema = im.convert("L").getextrema()
            assert extrema[0] != extrema[1], "a blank picture"
    return page


def report(path: Path | str, out: Path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    res = fg("report", str(path), "-o", str(out), "--json", *args)
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout), res


def summary(path: Path | str, **kw) -> dict:
    """The report document, in-process (what --json prints, without drawing the page)."""
    from fgdata.report.collect import collect
    from fgdata.report.summary import summarise

    thresholds = kw.pop("thresholds", None)
    stats = collect(require_shards(str(path)), **kw)
    return summarise(stats, name="test", paths=[str(path)], thresholds=thresholds, sample=kw.get("sample", 1000))


def assert_counts_match(doc: dict, path: Path | str) -> None:
    counted = json.loads(fg("count-shards", str(path), "--json", "--no-write").stdout)
    assert doc["total_samples"] == counted["total_samples"]
    assert [(s["shard"], s["samples"]) for s in doc["shards"]] == [(s["shard"], s["samples"]) for s in counted["shards"]]


# -- datasets ------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory, sample_data) -> Path:
    """fgdata's own image shards (json with width and height), two shards, a numeric score per photo."""
    from fgdata.sharding.job import ShardJob, run_shard
    from fgdata.producers.media import ShardOptions

    src = tmp_path_factory.mktemp("photos")
    photos = [p for p in sorted(sample_data.iterdir()) if p.suffix in (".jpg", ".png")]
    for i, p in enumerate(photos):
        shutil.copyfile(p, src / p.name)
        shutil.copyfile(p.with_suffix(".txt"), src / f"{p.stem}.txt")
        (src / f"{p.stem}.json").write_text(json.dumps({"aesthetic_score": 4.0 + 0.5 * i, "tag": "demo"}))
    dest = tmp_path_factory.mktemp("image-shards")
    run_shard(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="images"), maxcount=4))
    return dest


@pytest.fixture(scope="module")
def video_shards(tmp_path_factory, sample_video, clip_encoder) -> Path:
    """fgdata's video shards: the bundled clip (6-channel audio), a stereo clip and a silent one."""
    from fgdata.sharding.job import ShardJob, run_shard
    from fgdata.producers.media import ShardOptions

    src = tmp_path_factory.mktemp("clips")
    shutil.copyfile(sample_video, src / "bunny.mp4")
    (src / "bunny.txt").write_text("A big rabbit wakes up in a meadow.")
    (src / "stereo.mp4").write_bytes(clip_encoder(frames=36, fps=12, audio_channels=2))
    (src / "stereo.txt").write_text("Grey frames with a tone.")
    (src / "silent.mp4").write_bytes(clip_encoder(frames=24, fps=24, size=(48, 64)))
    (src / "silent.txt").write_text("A silent portrait clip.")
    dest = tmp_path_factory.mktemp("video-shards")
    run_shard(ShardJob(src=str(src), dest=str(dest), options=ShardOptions(kind="videos"), maxcount=2))
    return dest


@pytest.fixture(scope="module")
def latent_shards(tmp_path_factory) -> Path:
    """Latent shards as `fgdata encode latents` lays them out: latent.pth, txt and json."""
    import torch

    dest = tmp_path_factory.mktemp("latents")
    g = torch.Generator().manual_seed(0)
    with ShardWriter(str(dest), maxcount=3) as w:
        for i in range(7):
            buf = io.BytesIO()
            torch.save(torch.randn(4, 8, 8, generator=g), buf)
            w.write(f"{i:06d}", {"latent.pth": buf.getvalue(), "txt": f"prompt number {i}".encode(),
                                 "json": json.dumps({"source": f"img{i}.jpg"}).encode()})
    return dest


@pytest.fixture(scope="module")
def prompt_shards(tmp_path_factory) -> Path:
    from fgdata.sharding.job import ShardJob, run_shard
    from fgdata.producers.media import ShardOptions

    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("\n".join(["a red fox in the snow", "the skyline of a city at night", "a bowl of ramen",
                                  "an astronaut riding a horse", "the moon over a lake"]) + "\n")
    dest = tmp_path_factory.mktemp("prompt-shards")
    run_shard(ShardJob(src=str(prompts), dest=str(dest), options=ShardOptions(kind="prompts"), maxcount=2))
    return dest


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory, sample_data, clip_encoder) -> Path:
    """Shards written by webdataset's TarWriter: no fgdata metadata, one sample without its caption."""
    import webdataset as wds

    dest = tmp_path_factory.mktemp("wds")
    photos = [p for p in sorted(sample_data.iterdir()) if p.suffix in (".jpg", ".png")]
    for s in range(2):
        with wds.TarWriter(str(dest / f"part-{s}.tar")) as sink:
            for i, p in enumerate(photos):
                sample = {"__key__": f"s{s}/{p.stem}", p.suffix[1:]: p.read_bytes(),
                          "json": {"aesthetic_score": 3.5 + i, "url": f"https://example.com/{p.name}"}}
                if not (s == 1 and i == 0):
                    sample["txt"] = p.with_suffix(".txt").read_text()
                sink.write(sample)
            sink.write({"__key__": f"s{s}/clip", "mp4": clip_encoder(frames=24, fps=24, audio_channels=1),
                        "txt": "a clip"})
    return dest


# -- tests ---------------------------------------------------------------------


def test_image_report(image_shards, sample_data, tmp_path):
    doc, res = report(image_shards, tmp_path / "r.html", "--contact-sheet", str(tmp_path / "sheet.png"))
    assert res.returncode == 0, res.stderr
    page = check_page(tmp_path / "r.html")
    text = " ".join(page.text)
    assert image_shards.name in text and __version__ in text and doc["generated"][:10] in text
    assert_counts_match(doc, image_shards)
    im = doc["images"]
    assert im["members"] == im["sized"] == im["sizes_from_json"] == 7  # fgdata's json metadata, no decode
    assert doc["decoded_members"] == 0
    assert "downloads" not in doc and "Downloads" not in text  # no shard_stats.json: not a URL job
    photos = [p for p in sample_data.iterdir() if p.suffix in (".jpg", ".png")]  # what the fixture sharded
    assert im["width"]["max"] == max(Image.open(p).width for p in photos)
    assert doc["captions"]["samples"] == 7
    assert len(doc["contact_sheet"]) == 7 and len(page.images) >= 7 + 4
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.width > 500
    assert doc["problems"] == []


def test_score_filter_numbers_match_the_loader(image_shards):
    """The kept count shown for a threshold is what the loaders' score filter keeps, sample by sample."""
    from fgdata.loaders.presets import build_filters

    doc = summary(image_shards, thresholds={"aesthetic_score": 5.2})
    field = doc["numeric_fields"]["aesthetic_score"]
    spec = field["score_filter"]["presets_filter"]
    assert spec == {"score": {"score_key": "aesthetic_score", "threshold": 5.2}}
    [score] = build_filters(spec)
    kept = sum(score.check(s.members) is None for shard in require_shards(str(image_shards)) for s in iter_samples(shard))
    assert field["score_filter"]["kept"] == kept and 0 < kept < 7
    assert "tag" not in doc["numeric_fields"] and "width" not in doc["numeric_fields"]


def test_video_audio_report(video_shards, tmp_path):
    doc, res = report(video_shards, tmp_path / "r.html")
    assert res.returncode == 0, res.stderr
    check_page(tmp_path / "r.html")
    assert_counts_match(doc, video_shards)
    v = doc["videos"]
    assert v["members"] == v["described"] == v["facts_from_json"] == 3
    assert v["with_audio"] == 2 and v["audio_share"] == pytest.approx(2 / 3)
    assert v["fps"]["max"] == pytest.approx(25) and v["frames"]["min"] == 24
    assert v["resolutions"] == {"1280×720": 1, "64×48": 1, "48×64": 1}
    assert len(doc["contact_sheet"]) == 3  # first frames


def test_latent_report(latent_shards, tmp_path):
    doc, res = report(latent_shards, tmp_path / "r.html", "--sample", "4")
    assert res.returncode == 0, res.stderr
    check_page(tmp_path / "r.html")
    assert_counts_match(doc, latent_shards)
    assert 0 < doc["decoded_members"] <= 4  # --sample bounds the decoded members
    assert doc["tensors"] == {"latent.pth float32[4,8,8]": doc["decoded_members"]}
    assert "images" not in doc and "videos" not in doc and doc["contact_sheet"] == []


def test_prompt_report(prompt_shards, tmp_path):
    doc, res = report(prompt_shards, tmp_path / "r.html")
    assert res.returncode == 0, res.stderr
    check_page(tmp_path / "r.html")
    assert_counts_match(doc, prompt_shards)
    c = doc["captions"]
    assert c["samples"] == 5 and c["words"]["min"] == 4 and c["words"]["max"] == 7
    assert dict(c["first_words"]) == {"a": 2, "the": 2, "an": 1}


def test_webdataset_shards_report_with_headers_and_probes(wds_shards, tmp_path):
    doc, res = report(wds_shards, tmp_path / "r.html")
    assert res.returncode == 1, res.stderr  # one sample lacks its caption: a problem, exit 1
    check_page(tmp_path / "r.html")
    assert_counts_match(doc, wds_shards)
    im = doc["images"]
    assert im["members"] == im["sized"] == 14 and im["sizes_from_json"] == 0  # from image headers
    assert doc["videos"]["described"] == 2 and doc["videos"]["facts_from_json"] == 0  # probed
    assert doc["videos"]["with_audio"] == 2
    missing = [p for p in doc["problems"] if p["kind"] == "missing .txt"]
    assert missing and missing[0]["count"] == 1 and "s1/" in missing[0]["examples"][0]
    assert set(doc["numeric_fields"]) == {"aesthetic_score"}


def test_sample_budget_and_workers_do_not_change_the_result(wds_shards):
    from fgdata.jobs.executor import process_map

    one = summary(wds_shards, sample=3)
    two = summary(wds_shards, sample=3, pool=process_map(2, "reading the shards"))
    assert one["decoded_members"] == 3  # one image header or video probe per picked sample
    assert one["images"]["sized"] < 14 and one["total_samples"] == 16
    for doc in (one, two):
        doc.pop("generated")
    assert one == two


def test_damaged_shard_is_reported(image_shards, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    shards = sorted(image_shards.glob("*.tar"))
    shutil.copyfile(shards[0], bad / shards[0].name)
    data = shards[1].read_bytes()
    (bad / shards[1].name).write_bytes(data[: len(data) // 2])
    doc = summary(bad)
    assert_counts_match(doc, bad)
    damaged = [s for s in doc["shards"] if s["damage"]]
    assert [s["shard"] for s in damaged] == [shards[1].name]
    assert "damaged shard" in {p["kind"] for p in doc["problems"]}


def test_terminal_summary_and_overwrite(image_shards, tmp_path):
    out = tmp_path / "r.html"
    res = fg("report", str(image_shards), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "samples" in res.stdout and "7 in 2 shards" in res.stdout and f"wrote {out}" in res.stdout
    again = fg("report", str(image_shards), "-o", str(out))
    assert again.returncode == 1 and "--overwrite" in again.stderr
    again = fg("report", str(image_shards), "-o", str(out), "--overwrite")
    assert again.returncode == 0 and f"removing {out}" in again.stderr


def test_bad_threshold_is_a_usage_error(image_shards, tmp_path):
    res = fg("report", str(image_shards), "-o", str(tmp_path / "r.html"), "--threshold", "score")
    assert res.returncode == 2 and "FIELD=NUMBER" in res.stderr


@pytest.mark.s3
@pytest.mark.slow  # an S3 job through s5cmd and the loopback server
def test_report_on_s3(image_shards, s3_bucket, tmp_path):
    from fgdata import storage

    for p in sorted(x for x in image_shards.iterdir() if x.is_file()):
        storage.upload(str(p), f"{s3_bucket}/photos/{p.name}")
    doc, res = report(f"{s3_bucket}/photos", tmp_path / "r.html")
    assert res.returncode == 0, res.stderr
    check_page(tmp_path / "r.html")
    local = summary(image_shards)
    assert doc["total_samples"] == local["total_samples"] == 7
    assert doc["images"] == local["images"] and doc["extension_sets"] == local["extension_sets"]
    assert doc["contact_sheet"] == local["contact_sheet"]
    assert_counts_match(doc, f"{s3_bucket}/photos")


def test_a_file_that_is_not_a_shard(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(np.random.default_rng(0).bytes(3000))
    res = fg("report", str(junk), "-o", str(tmp_path / "r.html"), "--json")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    assert doc["total_samples"] == 0 and doc["problems"][0]["kind"] == "damaged shard"


def test_report_lists_every_structural_problem_verify_finds(tmp_path):
    """No end-of-archive blocks, a link member, a 0-byte shard: verify's findings, by verify's checks, are the
    report's problems too (it used to say "problems none")."""
    import tarfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
    from faultkit import layout, make_tar, png_bytes

    ds = tmp_path / "ds"
    ds.mkdir()
    make_tar(ds / "00000.tar", [("a.png", png_bytes(0)), ("a.txt", b"one")])
    end = -(-layout(ds / "00000.tar").payloads[-1][1] // 512) * 512  # the last member's padded end
    (ds / "00000.tar").write_bytes((ds / "00000.tar").read_bytes()[:end])  # no end-of-archive blocks
    make_tar(ds / "00001.tar", [("b.png", png_bytes(1)), ("b.txt", tarfile.SYMTYPE, "/etc/passwd")])
    (ds / "00002.tar").write_bytes(b"")
    verified = json.loads(fg("verify", str(ds), "--json").stdout)
    found = {p["reason"] for s in verified["per_shard"] for p in s["problems"]}
    assert {"truncated", "link-member", "empty-shard"} <= found
    doc = summary(ds)
    assert found <= {p["kind"] for p in doc["problems"]}, doc["problems"]
    res = fg("report", str(ds), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 1 and "problems none" not in " ".join(res.stdout.split())


def test_a_worker_killed_with_its_result_ends_report_with_one_line(wds_shards, tmp_path):
    """SIGKILL of a worker holding a shard's statistics (what the out-of-memory killer does): ``report`` ends with
    one error line and exit 1 instead of waiting for them, writes no page, and leaves no worker behind. The kill
    happens at the point the worker signals (FGDATA_TEST_HOLD=worker-result)."""
    from faultkit import FGDATA, alive, kill_worker_with_result

    page = tmp_path / "r.html"
    killed = kill_worker_with_result([*FGDATA, "report", str(wds_shards), "-o", str(page), "--workers", "2"])
    assert killed.returncode == 1, killed.stderr[-2000:]
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: a worker process died while reading the shards") and \
        last.endswith("nothing was written"), killed.stderr[-2000:]
    assert "Traceback" not in killed.stderr
    assert not page.exists()
    assert killed.siblings and not any(alive(pid) for pid in killed.siblings)

"""The loader's control data (drops, replaced positions, a worker's error) stays out of the user's batch.

Every WDS loader kind gets a dataset whose second sample is unusable for it; in deterministic
mode that position delivers the next usable sample. The batches must carry only the documented
diagnostic keys, be the same with and without DataLoader workers, and the loader must still
count the drop and warn about the replacement in the main process.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from fgdata.errors import FgdataError
from fgdata.loaders import AudioVideoWDSLoader, CameraVideoWDSLoader, ImageWDSLoader, VideoWDSLoader, WDSLoader
from fgdata.loaders.collate import BatchSlots
from fgdata.shards import ShardWriter

from .conftest import camera_track, grid_key, npy_bytes, write_grid

KEYS = ["s0", "s1", "s2", "s3"]
DIAGNOSTIC_KEYS = {"__key__", "__index__"}  # the only ``__`` keys a deterministic batch shows its user
CLIP = {"sequence_length": 8, "img_size": (32, 32), "decoder_type": "full"}


def _jpeg(shade: int) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", (48, 40), (shade, 255 - shade, 128)).save(b, "JPEG", quality=90)
    return b.getvalue()


def _write(dest: str, members: Callable[[int], dict[str, bytes]]) -> str:
    with ShardWriter(dest, maxcount=4) as w:
        for i, key in enumerate(KEYS):
            w.write(key, members(i))
    return dest


def _clip_members(encode: Callable[..., bytes], i: int, audio: bool = False, camera: bool = False) -> dict[str, bytes]:
    """Clip ``i``: the second (6 frames) is too short for 8-frame clips."""
    frames = 6 if i == 1 else 12 + i
    out = {"mp4": encode(frames=frames, size=(48, 32), audio_channels=2 if audio else None)}
    if camera:
        poses, intr = camera_track(frames, 48, 32)
        out |= {"poses.npy": npy_bytes(poses), "intrinsics.npy": npy_bytes(intr)}
    return out


def _wds(tmp_path, encode) -> tuple[type, dict[str, Any]]:
    d = write_grid(str(tmp_path / "s"), shards=1, per=4, skip={(0, 1)})  # sample 1 lacks its npy member
    return WDSLoader, {"datatags": ["WDS:" + d], "key_map": {"real": "npy", "condition": "txt"}}


def _image(tmp_path, encode) -> tuple[type, dict[str, Any]]:
    d = _write(str(tmp_path / "s"), lambda i: {"jpg": b"\xff\xd8 not a jpeg" if i == 1 else _jpeg(40 * i), "txt": b"x"})
    return ImageWDSLoader, {"datatags": ["WDS:" + d], "input_res": 16, "key_map": {"real_raw": "jpg", "condition_raw": "txt"}}


def _video(tmp_path, encode) -> tuple[type, dict[str, Any]]:
    d = _write(str(tmp_path / "s"), lambda i: _clip_members(encode, i))
    return VideoWDSLoader, {"datatags": ["WDS:" + d], "key_map": {"real_raw": "mp4"}, **CLIP}


def _audio_video(tmp_path, encode) -> tuple[type, dict[str, Any]]:
    d = _write(str(tmp_path / "s"), lambda i: _clip_members(encode, i, audio=True))
    return AudioVideoWDSLoader, {"datatags": ["WDS:" + d], "key_map": {"real_raw": "mp4"}, **CLIP}


def _camera(tmp_path, encode) -> tuple[type, dict[str, Any]]:
    d = _write(str(tmp_path / "s"), lambda i: _clip_members(encode, i, camera=True))
    key_map = {"real_raw": "mp4", "camera_poses": "poses.npy", "camera_intrinsics": "intrinsics.npy"}
    return CameraVideoWDSLoader, {"datatags": ["WDS:" + d], "key_map": key_map, **CLIP}


KINDS = {"wds": _wds, "image": _image, "video": _video, "audio-video": _audio_video, "camera": _camera}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("kind", list(KINDS))
def test_replacement_is_counted_and_warned_but_never_in_the_batch(tmp_path, clip_encoder, kind):
    cls, kwargs = KINDS[kind](tmp_path, clip_encoder)
    runs = {}
    for workers in (0, 2):
        loader = cls(batch_size=2, deterministic=True, train=False, num_workers=workers, **kwargs)
        with pytest.warns(UserWarning, match=r"1 of the 4 positions this rank delivered \(25.0%\) were replacements"):
            runs[workers] = list(loader)
        assert loader.state_dict()["drops"] == 1 and loader.state_dict()["position"] == 4
    batches = runs[0]
    delivered = (0, 2, 2, 3)  # position 1 delivered the next usable sample
    names = [grid_key(0, i) if kind == "wds" else KEYS[i] for i in delivered]
    assert [k for b in batches for k in b["__key__"]] == names
    assert [b["__index__"].tolist() for b in batches] == [[0, 1], [2, 3]]
    for b in batches:
        assert {k for k in b if k.startswith("__")} == DIAGNOSTIC_KEYS
        assert set(b) == set(batches[0])
    assert len(runs[2]) == len(batches) and all(_same(a, b) for a, b in zip(batches, runs[2]))
    # what a worker hands over: the same batch dicts, the control data beside them
    built = list(cls(batch_size=2, deterministic=True, train=False, num_workers=0, **kwargs).worker_batches(0, 0, 0, 1))
    assert all(_same(b.data, batch) for b, batch in zip(built, batches))
    assert [(b.drops, b.replaced) for b in built] == [(1, [1]), (0, [])]


def test_a_workers_error_reaches_the_user_as_its_own_one_line_error(tmp_path, clip_encoder):
    cls, kwargs = _wds(tmp_path, clip_encoder)
    loader = cls(batch_size=2, deterministic=True, train=False, num_workers=2, strict=True, **kwargs)
    with pytest.raises(FgdataError, match=r"key '00000_00001' \(position 1\).*missing member") as caught:
        list(loader)
    assert type(caught.value) is FgdataError and "\n" not in str(caught.value)
    assert "DataLoader worker" not in str(caught.value)


class _SlotTensors(torch.utils.data.IterableDataset):
    """Allocates one batch tensor through BatchSlots where it runs and says whether it is in shared memory."""

    def __iter__(self):
        slots = BatchSlots(1)
        slots.next_row(0)
        row = slots.row("x", (2, 3))
        row[:] = 7
        tensor = slots.claim([row])
        yield {"shared_where_built": tensor.is_shared(), "x": tensor}


def test_batch_tensors_are_built_in_shared_memory_only_inside_a_worker():
    """A worker writes its batch into shared memory, so sending it to the main process copies nothing;
    the main process keeps numpy's allocator."""
    in_main = next(iter(_SlotTensors()))
    assert not in_main["shared_where_built"]
    loader = torch.utils.data.DataLoader(_SlotTensors(), batch_size=None, num_workers=1)
    from_worker = next(iter(loader))
    assert from_worker["shared_where_built"]
    np.testing.assert_array_equal(from_worker["x"].numpy(), np.full((1, 2, 3), 7, np.float32))

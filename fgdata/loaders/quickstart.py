"""One batch through ImageWDSLoader, for ``fgdata quickstart``: proof that written shards load."""

from __future__ import annotations

from fgdata.errors import FgdataError


def quickstart_batch(shard_dir: str, input_res: int = 64, batch_size: int = 2) -> dict[str, tuple]:
    """Load the first batch of image+txt shards under ``shard_dir``; return key -> shape.

    The image member is whichever image extension the first sample carries (jpg,
    png, ...). Tensors report their shape, lists ``(len,)``. Deterministic mode
    in-process keeps it quick and reproducible.
    """
    from fgdata.loaders.wds import ImageWDSLoader
    from fgdata.media.decode import member_kind
    from fgdata.shards import iter_samples, require_shards

    first = next(iter_samples(require_shards(shard_dir)[0]), None)
    image_ext = next((e for e in sorted(first.members) if member_kind(e) == "image"), None) if first else None
    if image_ext is None:
        raise FgdataError(f"{shard_dir}: the first sample has no image member")
    key_map = {"real_raw": image_ext}
    if "txt" in first.members:
        key_map["condition_raw"] = "txt"
    loader = ImageWDSLoader(
        [f"WDS:{shard_dir}"],
        batch_size=batch_size,
        input_res=input_res,
        key_map=key_map,
        presets_map={"neg_condition_raw": "empty_string"},
        deterministic=True,
        train=False,
        partial=True,
        num_workers=0,
    )
    batch = next(iter(loader))
    return {k: tuple(v.shape) if hasattr(v, "shape") else (len(v),) for k, v in batch.items()}

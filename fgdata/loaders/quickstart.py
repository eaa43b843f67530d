"""One batch through ImageWDSLoader, for ``fgdata quickstart``: proof that written shards load."""

from __future__ import annotations


def quickstart_batch(shard_dir: str, input_res: int = 64, batch_size: int = 2) -> dict[str, tuple]:
    """Load the first batch of image shards under ``shard_dir``; return key -> shape.

    The image member is whichever image extension a sample carries (jpg, png, ...) and a
    missing caption is the empty string. Tensors report their shape, lists ``(len,)``.
    Deterministic mode in-process keeps it quick and reproducible.
    """
    from fgdata.loaders.decoders import IMAGE_MEMBERS
    from fgdata.loaders.wds import ImageWDSLoader

    loader = ImageWDSLoader(
        [f"WDS:{shard_dir}"],
        batch_size=batch_size,
        input_res=input_res,
        key_map={"real_raw": IMAGE_MEMBERS, "condition_raw": "txt"},
        missing_text="empty",
        presets_map={"neg_condition_raw": "empty_string"},
        deterministic=True,
        train=False,
        partial=True,
        num_workers=0,
    )
    batch = next(iter(loader))
    return {k: tuple(v.shape) if hasattr(v, "shape") else (len(v),) for k, v in batch.items()}

"""Running models, for every command that does (encode, kd, fid-refs, score, prepare's latents): loading by hub id
or local directory, device, dtype, autocast, batches, and decoding ahead of the model.

It sits below those commands so that none imports another for these helpers (``fid`` never imports ``encode``).

Every model (VAEs, text encoders, KD denoisers and schedulers) loads through :func:`load_pretrained`,
which gives one line naming the model and the flag that takes a directory when the hub cannot be
reached (offline, no cached weights) instead of a stack of retries.

Every command that needs a model calls :func:`check_model` before its first long pass and before it
writes anything, so a missing directory, an id that is not cached while ``HF_HUB_OFFLINE`` is set, an
unknown id, or a hub that cannot be reached fails in one line within seconds (one request to the hub,
no retries), instead of after hours of work.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fgdata.errors import FgdataError, OptionError
from fgdata.jobs import outputs

__all__ = ["DTYPES", "autocast", "batches", "check_device", "check_dtype", "check_model", "hf_cache_dir", "load_pretrained",
           "model_source", "prefetch_map", "resolve_device", "tensor_bytes", "torch_dtype"]

T = TypeVar("T")
R = TypeVar("R")

HUB_CHECK_TIMEOUT = 10.0  # seconds for the one request that asks the hub whether a model id exists

DTYPES = ("float32", "bfloat16", "float16")


def hf_cache_dir() -> str:
    """The Hugging Face cache in use (HF_HOME is respected by huggingface_hub); logged in provenance."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve_device(device: str = "cpu") -> str:
    """``auto`` picks CUDA when present; ``cuda`` under torchrun means this process's LOCAL_RANK device."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    check_device(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FgdataError(f"device {device} requested but CUDA is not available; use --device cpu")
    return device


def check_device(device: str) -> str:
    """A device name torch understands (``auto`` too), whether or not this machine has it; else a usage error."""
    if device in ("auto", "cpu", "cuda"):
        return device
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise OptionError(f"--device {device!r} is not a device (auto, cpu, cuda, cuda:N, ...)") from None
    return device


def check_dtype(name: str, flag: str = "dtype") -> str:
    """One of :data:`DTYPES`, else a usage error naming ``flag``."""
    if name not in DTYPES:
        raise OptionError(f"{flag} {name!r} is not one of {', '.join(DTYPES)}")
    return name


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, check_dtype(name))


def model_source(id_or_dir: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is a local directory)."""
    local = Path(id_or_dir).expanduser()
    return (str(local), True) if local.is_dir() else (id_or_dir, False)


def _looks_like_path(id_or_dir: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else the user meant as a directory."""
    return id_or_dir.startswith(("/", ".", "~")) or id_or_dir.count("/") > 1 or (os.sep != "/" and os.sep in id_or_dir)


def _cached(repo_id: str) -> bool:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id, local_files_only=True)
    except (OSError, ValueError):
        return False
    return True


def check_model(id_or_dir: str, what: str, flag: str, subfolders: tuple[str | None, ...] = (None,)) -> None:
    """Fail in one line, in seconds, unless ``id_or_dir`` can be found: call it before any long pass or output.

    A directory must exist with each of ``subfolders``; a hub id must be in the cache when
    ``HF_HUB_OFFLINE`` is set, and otherwise the hub must answer for it within a few seconds. The
    weights themselves load (and download) later through :func:`load_pretrained`.
    """
    source, local = model_source(id_or_dir)
    if local:
        for sub in subfolders:
            if sub and not (Path(source) / sub).is_dir():
                raise FgdataError(f"{source}: has no {sub}/ folder (expected a diffusers pipeline directory)")
        return
    if _looks_like_path(id_or_dir):
        raise FgdataError(f"{id_or_dir}: no such {what} directory ({flag})")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    way_out = f"pass {flag} DIR with a directory saved by save_pretrained"
    if constants.HF_HUB_OFFLINE:
        if not _cached(id_or_dir):
            raise FgdataError(f"{id_or_dir}: HF_HUB_OFFLINE is set and this {what} is not in the cache "
                              f"({hf_cache_dir()}); {way_out}")
        return
    try:
        HfApi().model_info(id_or_dir, timeout=HUB_CHECK_TIMEOUT)
    except (RepositoryNotFoundError, HFValidationError):
        raise FgdataError(f"{id_or_dir}: no such {what} on {constants.ENDPOINT} (or it is private: log in "
                          f"with `hf auth login`); {way_out}") from None
    except HfHubHTTPError:
        return  # the hub answered (a mirror without the API, a rate limit): loading decides
    except Exception as exc:  # noqa: BLE001 - any transport error means no route to the hub
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if _cached(id_or_dir):
            raise FgdataError(f"{id_or_dir}: cannot reach {constants.ENDPOINT} ({reason}); set HF_HUB_OFFLINE=1 "
                              f"to use the cached copy, or {way_out}") from None
        raise FgdataError(f"{id_or_dir}: cannot reach {constants.ENDPOINT} ({reason}) and this {what} is not "
                          f"in the cache ({hf_cache_dir()}); {way_out}") from None


def _follow_hub_progress_setting() -> None:
    """diffusers reads no variable for its bars (loading checkpoint shards): it follows the hub's here, which the
    CLI turns off when it draws no bars of its own."""
    diffusers_logging = sys.modules.get("diffusers.utils.logging")
    if diffusers_logging is None:
        return
    from huggingface_hub.utils import are_progress_bars_disabled

    if are_progress_bars_disabled():
        diffusers_logging.disable_progress_bar()


def load_pretrained(cls: Any, id_or_dir: str, what: str, flag: str, subfolder: str | None = None, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` with one-line errors naming the model and the ``flag`` that takes a directory."""
    source, local = model_source(id_or_dir)
    if local and subfolder and not (Path(source) / subfolder).is_dir():
        raise FgdataError(f"{source}: has no {subfolder}/ folder (expected a diffusers pipeline directory)")
    _follow_hub_progress_setting()
    try:
        if subfolder:
            kwargs["subfolder"] = subfolder
        model = cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError, EnvironmentError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "low_cpu_mem_usage" in first:
            raise FgdataError(f"{id_or_dir}: loading this {what} needs the accelerate package (pip install accelerate)") from None
        if local:
            raise FgdataError(f"{source}{'/' + subfolder if subfolder else ''}: cannot load the {what} ({first})") from None
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set and no local weights are cached" if offline else f"cannot download it ({first})"
        raise FgdataError(
            f"{id_or_dir}: {why} (cache: {hf_cache_dir()}); pass {flag} DIR with a directory saved by save_pretrained"
        ) from None
    outputs.model_loaded(what)
    return model


@contextlib.contextmanager
def autocast(device: str, dtype: str, enabled: bool) -> Iterator[None]:
    """Inference mode, plus autocast to ``dtype`` when asked (weights then stay float32)."""
    import torch

    with torch.inference_mode():
        if enabled and dtype != "float32":
            with torch.autocast(device_type=device.split(":")[0], dtype=torch_dtype(dtype)):
                yield
        else:
            yield


def tensor_bytes(tensor: Any, dtype: str | None = None) -> bytes:
    """``torch.save`` of a contiguous clone (a view would save its whole storage), optionally cast."""
    import torch

    t = tensor.detach()
    if dtype is not None:
        t = t.to(torch_dtype(dtype))
    buf = io.BytesIO()
    torch.save(t.clone().contiguous(), buf)
    return buf.getvalue()


def prefetch_map(fn: Callable[[T], R], items: Iterable[T], workers: int, ahead: int) -> Iterator[tuple[T, R | BaseException]]:
    """``(item, fn(item) or its exception)`` in order, with up to ``ahead`` items decoding on threads.

    Decoders (Pillow, PyAV) release the GIL, so the CPU decodes the next batch while the model runs. The threads
    are the job core's (:func:`fgdata.jobs.local.threaded_map`), so a stop ends them as it ends every pool.
    """
    from functools import partial

    from fgdata.jobs.local import threaded_map

    if workers <= 0:
        yield from map(partial(_paired, fn), items)
        return
    yield from threaded_map(partial(_paired, fn), items, workers, ahead)


def _paired(fn: Callable[[T], R], item: T) -> tuple[T, R | BaseException]:
    try:
        return item, fn(item)
    except Exception as exc:  # noqa: BLE001 - the caller turns it into a per-sample failure
        return item, exc


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), streamed."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch

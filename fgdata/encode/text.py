"""Text embeddings (``txt_emb.pth``, ``neg_prompt_emb.npy``) from T5 / umT5 / CLIP text encoders.

Padding semantics (recorded in provenance):

- ``zero`` (default for T5 and umT5, the Wan convention): tokens are padded to ``max_length``, the encoder runs
  with the attention mask, and every position past the prompt's own tokens (EOS included in the prompt) is set
  to exactly zero. Wan 2.1: ``[512, 4096]``.
- ``keep`` (default for CLIP, the Stable Diffusion convention): the encoder's output at the padding positions is
  kept as is, ``[77, D]``.

The stored tensor is the last hidden state (``--hidden-layer -1``), or another hidden layer when asked
(``-2`` is SDXL's penultimate layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fgdata.compute import autocast, check_dtype, check_model, load_pretrained, resolve_device, torch_dtype
from fgdata.errors import FgdataError, OptionError

if TYPE_CHECKING:
    from fgdata.jobs.summary import JobSummary
    from fgdata.jobs.driver import RunSettings

PADDINGS = ("zero", "keep")
# model_type -> (transformers class name, default padding, default max length)
FAMILIES = {
    "t5": ("T5EncoderModel", "zero", 512),
    "umt5": ("UMT5EncoderModel", "zero", 512),
    "mt5": ("MT5EncoderModel", "zero", 512),
    "clip_text_model": ("CLIPTextModel", "keep", 77),
    "clip": ("CLIPTextModel", "keep", 77),
}


@dataclass
class TextEncoder:
    model: Any
    tokenizer: Any
    source: str
    family: str
    padding: str
    max_length: int
    hidden_layer: int
    device: str
    dtype: str
    use_autocast: bool

    def info(self) -> dict[str, Any]:
        width = int(getattr(self.model.config, "d_model", 0) or getattr(self.model.config, "hidden_size", 0))
        return {
            "text_encoder": self.source,
            "text_encoder_class": type(self.model).__name__,
            "text_encoder_revision": getattr(self.model.config, "_commit_hash", None),
            "tokenizer_class": type(self.tokenizer).__name__,
            "max_length": self.max_length,
            "padding": self.padding,
            "padding_semantics": (
                f"padded to {self.max_length} tokens; positions past the prompt's tokens are zero"
                if self.padding == "zero"
                else f"padded to {self.max_length} tokens; the encoder's output at padding positions is kept"
            ),
            "hidden_layer": self.hidden_layer,
            "shape": [self.max_length, width],
            "compute_dtype": self.dtype,
            "autocast": self.use_autocast,
        }

    def encode(self, prompts: list[str]) -> Any:
        """float32 ``[B, max_length, D]`` on the CPU."""
        tok = self.tokenizer(
            list(prompts),
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids = tok["input_ids"].to(self.device)
        mask = tok["attention_mask"].to(self.device)
        with autocast(self.device, self.dtype, self.use_autocast):
            want_hidden = self.hidden_layer != -1
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=want_hidden)
            hidden = out.hidden_states[self.hidden_layer] if want_hidden else out.last_hidden_state
            hidden = hidden.float()
            if self.padding == "zero":
                hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        return hidden.cpu()


def load_text_encoder(
    id_or_dir: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    use_autocast: bool = False,
    max_length: int | None = None,
    padding: str | None = None,
    hidden_layer: int = -1,
    subfolder: str | None = None,
    tokenizer_subfolder: str | None = None,
    flag: str = "--encoder",
) -> TextEncoder:
    """Tokenizer and encoder from one hub id or directory (or a pipeline's text_encoder/ and tokenizer/)."""
    import transformers

    device = resolve_device(device)
    config = load_pretrained(transformers.AutoConfig, id_or_dir, "text encoder config", flag, subfolder)
    family = config.model_type
    class_name, default_padding, default_length = FAMILIES.get(family, ("AutoModel", "keep", 512))
    cls = getattr(transformers, class_name)
    weights_dtype = "float32" if use_autocast else dtype
    model = load_pretrained(cls, id_or_dir, "text encoder", flag, subfolder, dtype=torch_dtype(weights_dtype))
    tokenizer = load_pretrained(transformers.AutoTokenizer, id_or_dir, "tokenizer", flag, tokenizer_subfolder)
    check_padding(padding)
    padding = padding or default_padding
    if max_length is None:
        limit = getattr(tokenizer, "model_max_length", None)
        max_length = default_length if family in FAMILIES or not limit or limit > 100_000 else int(limit)
    positions = getattr(config, "max_position_embeddings", None)
    if family.startswith("clip") and positions and max_length > positions:
        raise OptionError(f"--max-length {max_length} exceeds the encoder's {positions} positions")
    return TextEncoder(
        model=model.eval().requires_grad_(False).to(device),
        tokenizer=tokenizer,
        source=id_or_dir,
        family=family,
        padding=padding,
        max_length=int(max_length),
        hidden_layer=hidden_layer,
        device=device,
        dtype=dtype,
        use_autocast=use_autocast,
    )


TXT_EMB_EXT = "txt_emb.pth"


def _prompt(members: dict[str, bytes], text_ext: str) -> str:
    if text_ext not in members:
        raise FgdataError(f"no {text_ext} member")
    try:
        return members[text_ext].decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise FgdataError(f".{text_ext} is not UTF-8 ({exc.reason})") from None


@dataclass(frozen=True)
class TextOptions:
    """``encode text``: every option that changes the output bytes (the resume fingerprint)."""

    encoder: str
    into: str | None = None
    subfolder: str | None = None
    tokenizer_subfolder: str | None = None
    text_ext: str = "txt"
    max_length: int | None = None
    padding: str | None = None
    hidden_layer: int = -1
    dtype: str = "float32"
    use_autocast: bool = False
    save_dtype: str = "float32"

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "--dtype")
        check_dtype(self.save_dtype, "--save-dtype")
        check_padding(self.padding)


def encode_text(src: str, dst: str, options: TextOptions, *, batch_size: int = 32, device: str = "cpu",
                run: RunSettings | None = None) -> JobSummary:
    """Add ``txt_emb.pth`` to every sample of ``src`` (all other members kept) and write the shards to ``dst``.

    With ``options.into``, the samples (and shard names) come from the existing shards in ``into`` (e.g.
    latent shards), and each sample's prompt is looked up by key in ``src``'s shard of the same name;
    ``dst`` may be ``into`` itself: each shard is replaced atomically, and a sample without a prompt keeps
    every member it had (reported as not updated).
    """
    from fgdata import storage
    from fgdata.encode.jobs import batched_results, merged_json, task_samples, user_json
    from fgdata.compute import tensor_bytes
    from fgdata.encode.tasks import Result, Task, TaskDefinition, TaskJob, same_place, shard_tasks
    from fgdata.jobs.driver import run_job

    if batch_size < 1:
        raise OptionError("--batch-size must be at least 1")
    o = options
    into = o.into
    check_model(o.encoder, "text encoder", "--encoder", (o.subfolder, o.tokenizer_subfolder))  # before any output
    state: dict[str, TextEncoder] = {}

    def model() -> TextEncoder:
        if "enc" not in state:
            state["enc"] = load_text_encoder(o.encoder, device=device, dtype=o.dtype, use_autocast=o.use_autocast,
                                             max_length=o.max_length, padding=o.padding, hidden_layer=o.hidden_layer,
                                             subfolder=o.subfolder, tokenizer_subfolder=o.tokenizer_subfolder)
        return state["enc"]

    def prompts_by_key(task: Task) -> dict[str, str] | None:
        if into is None:
            return None
        from fgdata.shards import iter_samples

        path = storage.join(src, task.name)
        if not storage.exists(path):
            return {}
        found: dict[str, str] = {}
        for s in iter_samples(path):
            try:
                found[s.key] = _prompt(s.members, o.text_ext)
            except FgdataError:
                continue
        return found

    def produce(task: Task) -> Any:
        enc = model()
        lookup = prompts_by_key(task)

        def prompts() -> Any:
            for s in task_samples(task):
                if isinstance(s, Result):
                    yield s
                    continue
                item: Any
                try:
                    user_json(s.members.get("json"))  # fails before the encoder runs, never replaced
                    if lookup is None:
                        item = s, _prompt(s.members, o.text_ext)
                    elif s.key in lookup:
                        item = s, lookup[s.key]
                    else:
                        raise FgdataError(f"no prompt for this key in {storage.join(src, task.name)}")
                except FgdataError as exc:
                    item = Result(s.index, s.key, None, str(exc), original=s.members)
                yield item

        def run_batch(batch: list[Any]) -> Any:
            embs = enc.encode([t for _, t in batch])
            for (s, text), emb in zip(batch, embs):
                members = dict(s.members)
                if lookup is not None:
                    members.setdefault(o.text_ext, text.encode())
                members[TXT_EMB_EXT] = tensor_bytes(emb, o.save_dtype)
                members["json"] = merged_json(s.members.get("json"), {"txt_emb": {
                    "encoder": o.encoder, "shape": list(emb.shape), "dtype": o.save_dtype, "padding": enc.padding,
                    "max_length": enc.max_length, "hidden_layer": enc.hidden_layer}})
                yield Result(s.index, s.key, members)

        yield from batched_results(prompts(), batch_size, run_batch)

    def provenance() -> dict[str, Any]:
        return {**model().info(), "save_dtype": o.save_dtype}

    samples_from = into or src
    job = TaskJob(dest=dst, command="encode text", tasks=shard_tasks(samples_from), options=o, produce=produce,
                  provenance=provenance, base=into if into and not same_place(into, dst) else None,
                  in_place=same_place(samples_from, dst), sources=(src, into))
    return run_job(TaskDefinition(job), run)


def check_padding(padding: str | None) -> None:
    """``--padding``: one of :data:`PADDINGS` (None: the encoder family's default), else a usage error."""
    if padding is not None and padding not in PADDINGS:
        raise OptionError(f"--padding {padding!r} is not one of {', '.join(PADDINGS)}")


def neg_prompt_text(preset: str | None, text: str | None) -> tuple[str, str]:
    """(text, description) from a presets_map name (``fgdata.catalog``) or a literal text."""
    if (preset is None) == (text is None):
        raise OptionError("give exactly one of --preset NAME or --text TEXT")
    if text is not None:
        return text, "text"
    from fgdata.catalog import PRESET_CONSTANTS

    if preset not in PRESET_CONSTANTS:
        raise OptionError(f"--preset {preset!r} is not one of {', '.join(sorted(PRESET_CONSTANTS))}")
    return PRESET_CONSTANTS[preset], f"preset:{preset}"


def encode_neg_prompt(out: str, *, encoder: str, preset: str | None = None, text: str | None = None,
                      **load_kwargs: Any) -> dict[str, Any]:
    """Write one negative-prompt embedding, shaped like one ``txt_emb``, as a plain float32 ``.npy``.

    The file is for ``files_map``, which loads it with pickle disabled: a plain array, never a list (an
    SDXL two-tensor embedding cannot be written this way). A JSON record goes beside it.
    """
    import json

    import numpy as np

    from fgdata import storage
    from fgdata.encode.vae import npy_bytes

    prompt, source = neg_prompt_text(preset, text)
    check_padding(load_kwargs.get("padding"))
    check_dtype(load_kwargs.get("dtype", "float32"), "--dtype")
    check_model(encoder, "text encoder", load_kwargs.get("flag", "--encoder"),
                (load_kwargs.get("subfolder"), load_kwargs.get("tokenizer_subfolder")))
    enc = load_text_encoder(encoder, **load_kwargs)
    emb = enc.encode([prompt])[0].numpy()
    if not isinstance(emb, np.ndarray) or emb.dtype == object:
        raise FgdataError("the encoder's output is not one plain array; refusing to pickle it")
    storage.write_bytes(out, npy_bytes(emb))
    import hashlib

    record = {**enc.info(), "source": source, "text_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
              "shape": list(emb.shape), "dtype": "float32"}  # not its own path: the same bytes wherever written
    storage.write_bytes(out + ".json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    return record

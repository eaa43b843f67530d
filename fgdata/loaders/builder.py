"""The sample builder: from a sample's raw members to the dict a batch is collated from.

It owns what the loader keywords say about one sample:

* ``key_map``: output key -> member extension, or several alternatives separated by
  ``;`` (``"jpg;png;webp"``: the first of these the sample has, webdataset's convention);
  each extension also matches its ``.gz`` form;
* ``files_map`` / ``presets_map`` constants (a constant stands in for a missing member);
* ``missing_text``: what a sample without its text member (a caption) becomes: ``"drop"``
  (the sample is unusable) or ``"empty"`` (the empty string);
* ``presets_filter`` predicates on the raw bytes, before anything is decoded;
* the per-modality decoders of :mod:`fgdata.loaders.decoders`, which turn members into values;
* scores written by ``fgdata score`` beside a shard (:mod:`fgdata.shards.scores`), joined by key into the
  sample's json as flat top-level fields before the filters run (:class:`ScoreJoin`).

It also tells a misconfigured loader from damaged data (:class:`KeyAudit`): a mapped key
that none of the first samples read has, or that no sample of a whole shard has, and clips
that are all shorter than ``sequence_length``, are errors raised at once, not drops.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fgdata.errors import ShardError
from fgdata.loaders.collate import BatchSlots, collate_samples
from fgdata.loaders.decoders import Decoder, MemberDecoder
from fgdata.loaders.presets import MemberFilter
from fgdata.loaders.selection import LoaderConfigError, ShardRef
from fgdata.media.decode import member_kind
from fgdata.media.errors import ClipTooShort, MediaError

log = logging.getLogger("fgdata.loaders")

#: How many samples read decide that a mapped key is absent by misconfiguration, not by damage.
AUDIT_FIRST_SAMPLES = 32
MISSING_TEXT_POLICIES = ("drop", "empty")


class SampleDropped(MediaError):
    """A sample cannot be used (a missing member, a filter); the message is the drop reason."""


class MissingMembers(SampleDropped):
    """Mapped keys whose members (every alternative) the sample lacks."""

    def __init__(self, message: str, keys: Sequence[str]):
        super().__init__(message)
        self.keys = tuple(keys)


# Bad data: a sample that cannot be used, or a damaged shard. Everything else propagates: a
# ValueError or RuntimeError from fgdata's own code is a bug, and unreachable storage
# (StorageError, OSError) must not turn into replaced samples that depend on the weather.
DROPPABLE = (MediaError, ShardError)


@dataclass
class RawSample:
    """One sample as read: the members the builder needs, and every extension the sample has."""

    key: str
    members: dict[str, bytes]
    exts: tuple[str, ...]
    ref: ShardRef
    index: int


@dataclass
class SampleContext:
    """Per-sample decode inputs: the RNG for random crops and segments, the global position
    (deterministic mode), the clips decoded so far (a camera track is sliced to its clip) and
    the batch's slots, where fixed-shape pixels are written in place."""

    rng: np.random.Generator
    position: int | None = None
    clips: dict[str, Any] = field(default_factory=dict)
    slots: BatchSlots | None = None

    def out(self, key: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """Where to write ``key``'s float32 ``shape`` value: its row of the batch tensor, or None (a new array)."""
        return None if self.slots is None else self.slots.row(key, shape)


def parse_key_map(key_map: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Output key -> extension alternatives, lower-cased, in the order given."""
    out: dict[str, tuple[str, ...]] = {}
    for key, spec in key_map.items():
        if not isinstance(spec, str):
            raise LoaderConfigError(f"key_map[{key!r}] = {spec!r}: must be an extension such as 'jpg' or 'jpg;png'")
        alternatives = tuple(dict.fromkeys(p.strip().lower() for p in spec.split(";")))
        if not all(alternatives):
            raise LoaderConfigError(f"key_map[{key!r}] = {spec!r}: an empty extension (alternatives are separated by ';')")
        out[key] = alternatives
    return out


def find_member(members: Mapping[str, bytes], alternatives: Sequence[str]) -> tuple[str, bytes] | None:
    """The first alternative the sample has, also as ``<ext>.gz``."""
    for ext in alternatives:
        if ext in members:
            return ext, members[ext]
        if ext + ".gz" in members:
            return ext + ".gz", members[ext + ".gz"]
    return None


def _spec(alternatives: Sequence[str]) -> str:
    return ";".join(alternatives)


def _counts(exts: Counter[str]) -> str:
    return ", ".join(f"{ext} in {n}" for ext, n in exts.most_common()) or "no members"


class KeyAudit:
    """Misconfiguration checks over the samples one worker reads.

    A key counts as missing only when none of its alternatives is present; keys backed by a
    constant, and text keys under ``missing_text="empty"``, never do.
    """

    def __init__(self, keys: Mapping[str, tuple[str, ...]], text_keys: Iterable[str], first_n: int):
        self.keys = dict(keys)
        self.text_keys = set(text_keys)
        self.first_n = max(1, first_n)
        self.reset()

    def reset(self) -> None:
        self.read = 0
        self.exts: Counter[str] = Counter()
        self.absent: Counter[str] = Counter()
        self.built = 0
        self.too_short = 0
        self.short_reason = ""

    def _has(self, exts: Iterable[str], alternatives: tuple[str, ...]) -> bool:
        present = set(exts)
        return any(a in present or a + ".gz" in present for a in alternatives)

    def _error(self, key: str, where: str, exts: Counter[str]) -> LoaderConfigError:
        alternatives = self.keys[key]
        hint = " (or missing_text='empty' to deliver '' when it is absent)" if key in self.text_keys else ""
        return LoaderConfigError(
            f"key_map[{key!r}] = {_spec(alternatives)!r}: no such member in {where}; they have {_counts(exts)}. "
            f"Set key_map[{key!r}] to the extension that holds it (alternatives separated by ';', e.g. 'jpg;png'){hint}"
        )

    def sample_read(self, raw: RawSample) -> None:
        """Count a sample read; raise when a key is absent from all of the first ``first_n``."""
        if self.read >= self.first_n:
            return
        self.read += 1
        self.exts.update(raw.exts)
        for key, alternatives in self.keys.items():
            if not self._has(raw.exts, alternatives):
                self.absent[key] += 1
        if self.read == self.first_n:
            for key in self.keys:
                if self.absent[key] == self.read:
                    raise self._error(key, f"any of the first {self.read} samples read (from {raw.ref.path})", self.exts)

    def shard_read(self, ref: ShardRef, samples: int, exts: Counter[str]) -> None:
        """After a whole shard was read: raise when a key is absent from every one of its samples."""
        if samples == 0:
            return
        for key, alternatives in self.keys.items():
            if not self._has(exts, alternatives):
                raise self._error(key, f"any of the {samples} samples of {ref.path}", exts)

    def sample_built(self, error: BaseException | None) -> None:
        """Count a build; raise when every one of the first ``first_n`` clips was too short."""
        if self.built >= self.first_n:
            return
        self.built += 1
        if isinstance(error, ClipTooShort):
            self.too_short += 1
            self.short_reason = str(error)
        if self.built == self.first_n:
            self.raise_if_all_too_short()

    def raise_if_all_too_short(self) -> None:
        """Raise when every sample built so far (at least one) was a clip too short."""
        if self.built and self.too_short == self.built:
            raise LoaderConfigError(self.too_short_message(self.built, self.short_reason))

    def too_short_message(self, n: int, reason: str) -> str:
        return (
            f"{n} consecutive unusable samples, every one too short: {reason}; "
            "lower sequence_length (or target_fps), or shard longer clips"
        )


class ScoreJoin:
    """The score files beside the shards, each read once per process (the last ``size`` shards kept)."""

    def __init__(self, size: int = 16):
        self.size = size
        self._rows: OrderedDict[str, dict[str, dict[str, Any]]] = OrderedDict()

    def fields(self, shard: str, key: str) -> dict[str, Any]:
        """The score fields of ``key`` in ``shard`` (empty when the shard has no score file or no row)."""
        from fgdata.shards.scores import numeric_fields, read_scores

        rows = self._rows.pop(shard, None)
        if rows is None:
            found = read_scores(shard)
            rows = {} if found is None else {k: numeric_fields(r) for k, r in found.rows.items()}
            if len(self._rows) >= self.size:
                self._rows.popitem(last=False)
        self._rows[shard] = rows
        return rows.get(key, {})

    def join(self, raw: RawSample) -> RawSample:
        """``raw`` with its scores set in its json member (a new one when it has none)."""
        fields = self.fields(raw.ref.path, raw.key)
        if not fields:
            return raw
        from fgdata.media.decode import unwrap_gz
        from fgdata.shards.scores import joined_json

        members = dict(raw.members)
        doc = members.pop("json", None)
        packed = members.pop("json.gz", None)
        if doc is None and packed is not None:
            try:
                doc = unwrap_gz("json.gz", packed)[1]
            except MediaError:
                members["json.gz"] = packed  # the filters report the damage, as without scores
                return replace(raw, members=members)
        members["json"] = joined_json(doc, fields)
        exts = raw.exts if "json" in raw.exts else (*raw.exts, "json")
        return replace(raw, members=members, exts=exts)


class SampleBuilder:
    """key_map + constants + filters + decoders -> a function from raw samples to sample dicts."""

    def __init__(
        self,
        key_map: Mapping[str, str],
        *,
        decoders: Sequence[Decoder] = (),
        constants: Mapping[str, Any] | None = None,
        filters: Sequence[MemberFilter] = (),
        txt_extensions: Sequence[str] = ("txt",),
        missing_text: str = "drop",
        audit_samples: int = AUDIT_FIRST_SAMPLES,
    ):
        if missing_text not in MISSING_TEXT_POLICIES:
            raise LoaderConfigError(f"missing_text={missing_text!r}: choose 'drop' (the sample is unusable) or 'empty' (the empty string)")
        self.keys = parse_key_map(key_map)
        self.txt_extensions = tuple(e.lower() for e in txt_extensions)
        self.constants = dict(constants or {})
        self.filters = list(filters)
        self.missing_text = missing_text
        self.text_keys = {k for k, alts in self.keys.items() if all(member_kind(a, self.txt_extensions) == "text" for a in alts)}
        self.decoders: list[Decoder] = [*decoders, MemberDecoder(self.txt_extensions)]
        audited = {k: a for k, a in self.keys.items()
                   if k not in self.constants and not (k in self.text_keys and missing_text == "empty")}
        self.audit = KeyAudit(audited, self.text_keys, audit_samples)
        self._warned: set[str] = set()
        self.scores = ScoreJoin()
        wanted = self.wanted
        self.joins_scores = wanted is None or "json" in wanted

    @property
    def wanted(self) -> frozenset[str] | None:
        """The member extensions worth reading: every alternative (also gzipped) and what the filters
        look at; None (every member) when a filter does not say what it reads."""
        exts = {e for alts in self.keys.values() for a in alts for e in (a, a + ".gz")}
        for f in self.filters:
            if "*" in f.needs:
                return None
            exts |= f.needs
        return frozenset(exts)

    def joined(self, raw: RawSample) -> RawSample:
        """``raw`` with its scores joined into its json, when anything reads the json (the readers call this as
        they read, so the key audit sees the json a score gave to a sample that had none)."""
        return self.scores.join(raw) if self.joins_scores else raw

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def build(self, raw: RawSample, ctx: SampleContext) -> dict[str, Any]:
        """The sample dict; raises a MediaError (a drop) when the sample cannot be used."""
        try:
            out = self._build(raw, ctx)
        except MediaError as exc:
            self.audit.sample_built(exc)
            raise
        self.audit.sample_built(None)
        return out

    def _build(self, raw: RawSample, ctx: SampleContext) -> dict[str, Any]:
        resolved: dict[str, tuple[str, bytes]] = {}
        filled: dict[str, str] = {}
        missing: list[str] = []
        for key, alternatives in self.keys.items():
            found = find_member(raw.members, alternatives)
            if found is not None:
                resolved[key] = found
            elif key in self.constants:
                self._warn_once(f"missing:{key}", f"member {_spec(alternatives)!r} missing in {raw.key!r}: keeping the constant for {key!r}")
            elif key in self.text_keys and self.missing_text == "empty":
                filled[key] = ""
            else:
                missing.append(key)
        if missing:
            names = ", ".join(repr(_spec(self.keys[k])) for k in missing)
            raise MissingMembers(f"missing member: {names}", missing)
        for f in self.filters:
            reason = f.check(raw.members)
            if reason is not None:
                raise SampleDropped(reason)
        out: dict[str, Any] = {"fname": raw.key, "shard": raw.ref.path, "__key__": raw.key}
        out.update(self.constants)
        out.update(filled)
        claimed: list[dict[str, tuple[str, bytes]]] = [{} for _ in self.decoders]
        for key, (ext, data) in resolved.items():
            i = next(i for i, d in enumerate(self.decoders) if d.claims(key, ext))
            claimed[i][key] = (ext, data)
        for decoder, items in zip(self.decoders, claimed):
            if items:
                decoder.decode(items, ctx, out, self._warn_once)
        return out

    def collate(self, samples: list[dict[str, Any]], slots: BatchSlots | None = None) -> dict[str, Any]:
        """The batch dict; a decoder may keep a field that cannot stack as a per-sample list."""
        loose: dict[tuple[str, str], list] = {}
        for decoder in self.decoders:
            loose.update(decoder.unstackable(samples, self._warn_once))
        batch = collate_samples(samples, slots)
        for (key, sub), values in loose.items():
            batch[key][sub] = values
        return batch

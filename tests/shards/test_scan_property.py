"""Random header mutations: every scan terminates, in bounded memory, and agrees with Python's tarfile.

"Agrees" means, for every mutated archive on which tarfile itself terminates:
  * the members fgdata yields are a prefix of tarfile's members, compared by header offset
    (the first extension header of a member), data offset, size, name and whether it is a file;
  * when fgdata reports no damage, tarfile yields exactly the same members and raises nothing;
  * when fgdata reports damage, it lies after the last member fgdata yielded and no later than the
    data of the next member tarfile yielded (fgdata never skips a member silently).
An empty file is the one input where fgdata is lenient: it reads as an archive without members (verify
then reports an empty shard), where tarfile raises.
fgdata may stop earlier than tarfile where tarfile is lenient (it reads "+12" or "1_0" as sizes, a PAX
size it cannot parse as 0, ...): those stops are damage, which the prefix rule allows. tarfile does not
terminate on some inputs (a negative size rewinds it); those are recognised by a read budget and only
fgdata's termination is checked.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fgdata.shards.scan import MAX_EXTENSION_HEADER, TarDamage, iter_members, scan_shard

sys.path.insert(0, str(Path(__file__).parent))
import tarcraft  # noqa: E402

# -- building and mutating archives --------------------------------------------

names = st.one_of(
    st.sampled_from(["a", "s1", "dir/s2", "x_y"]),
    st.lists(st.text("abcdef", min_size=1, max_size=30), min_size=6, max_size=9).map("/".join).map(lambda s: s.rjust(101, "z")),
)
members = st.dictionaries(st.sampled_from(["txt", "json", "bin"]), st.binary(max_size=1300), min_size=1, max_size=3)
samples = st.lists(st.tuples(names, members), min_size=1, max_size=5)

size_fields = st.one_of(
    st.integers(0, 4096).map(lambda n: b"%011o\0" % n),
    st.integers(1, 4096).map(lambda n: b"-%010o" % n),
    st.integers(0, 1 << 60).map(lambda n: b"%o" % n),
    st.integers(0, 1 << 80).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
    st.binary(min_size=1, max_size=11).map(lambda b: b"\xff" + b),
    st.sampled_from([b"+0000001000", b"0000000089\0", b"0o17", b"1_0", b"  12  ", b"12\0junk", b"", b"9" * 11]),
    st.binary(min_size=12, max_size=12),
)
typeflags = st.sampled_from([b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"L", b"K", b"x", b"X", b"g", b"S",
                             b"D", b"V", b"?"])
pax_values = st.one_of(
    st.integers(-(1 << 40), 1 << 40).map(str),
    st.sampled_from(["abc", "", " 12", "+5", "1e3", "99999999999999999999"]),
)
pax_records = st.lists(
    st.one_of(
        pax_values.map(lambda v: tarcraft.pax_record("size", v)),
        st.sampled_from(["p", "dir/q", "a" * 150]).map(lambda v: tarcraft.pax_record("path", v)),
        st.just(tarcraft.pax_record("comment", "hi")),
        st.just(tarcraft.pax_record("GNU.sparse.size", "5")),
        st.sampled_from([b"0 size=1\n", b"-5 size=1\n", b"99 size=1\n", b"11 size=12", b"5 a\n", b"junk", b"8 =x\n"]),
    ),
    max_size=3,
).map(b"".join)
mutations = st.lists(
    st.one_of(
        st.tuples(st.just("size"), st.integers(0, 50), size_fields),
        st.tuples(st.just("type"), st.integers(0, 50), typeflags),
        st.tuples(st.just("checksum"), st.integers(0, 50), st.binary(min_size=8, max_size=8)),
        st.tuples(st.just("pax"), st.integers(0, 50), pax_records),
    ),
    max_size=4,
)


@st.composite
def mutated_archives(draw) -> bytes:
    data = bytearray(tarcraft.clean_tar(draw(samples), draw(st.sampled_from([tarcraft.tarfile.PAX_FORMAT,
                                                                              tarcraft.tarfile.GNU_FORMAT]))))
    heads = tarcraft.header_offsets(bytes(data))
    inserts = []
    for kind, k, value in draw(mutations):
        at = heads[k % len(heads)]
        h = data[at : at + 512]
        if kind == "size":
            h[124:136] = value.ljust(12, b"\0")[:12]
        elif kind == "type":
            h[156:157] = value
        elif kind == "pax":
            inserts.append((at, tarcraft.pax_header(value)))
            continue
        if kind == "checksum":
            h[148:156] = value
        else:
            tarcraft.fix_checksum(h)
        data[at : at + 512] = h
    for at, block in sorted(inserts, reverse=True):
        data[at:at] = block
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data if cut is None else data[:cut])


# -- the two readers -------------------------------------------------------------

def fgdata_members(fileobj, **kw) -> tuple[list[tuple], int | None, int]:
    """(members, damage offset or None, end of the last member)."""
    out, damage, end = [], None, 0
    try:
        for m, _ in iter_members(fileobj, **kw):
            out.append((m.header_offset, m.data_offset, m.size, m.name.rstrip("/"), m.is_file))
            end = m.end
            assert len(out) <= kw.get("total", 1 << 30) // 512 + 1
    except TarDamage as exc:
        damage = exc.offset
    return out, damage, end


class _Budget(io.BytesIO):
    """An in-memory file that gives up after a bounded amount of reading: tarfile looping."""

    class Exhausted(Exception):
        pass

    def __init__(self, data: bytes):
        super().__init__(data)
        self.left = 8 * len(data) + 64 * 512

    def read(self, n: int | None = -1) -> bytes:
        chunk = super().read(n)
        self.left -= max(len(chunk), 1)
        if self.left < 0:
            raise self.Exhausted
        return chunk


def tarfile_members(data: bytes) -> tuple[list[tuple], bool] | None:
    """(members, raised an error), or None when tarfile did not terminate within the budget."""
    out, failed = [], False
    try:
        with tarfile.open(fileobj=_Budget(data), mode="r:") as tar:
            while (t := tar.next()) is not None:
                out.append((t.offset, t.offset_data, t.size, t.name.rstrip("/"),
                            t.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)))
    except _Budget.Exhausted:
        return None
    except Exception:  # noqa: BLE001 - tarfile's reaction to damage varies (ReadError, ValueError, ...)
        failed = True
    return out, failed


class Archive:
    """Mutated tar bytes with a short repr: they are in the reproduction blob; a 40 kB repr helps nobody."""

    def __init__(self, data: bytes):
        self.data = data

    def __repr__(self) -> str:
        return f"<archive of {len(self.data)} bytes>"


@settings(max_examples=int(os.environ.get("FGDATA_SCAN_EXAMPLES", "400")), deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
@given(mutated_archives().map(Archive))
def test_mutated_headers_terminate_and_agree_with_tarfile(tmp_path_factory, data):
    data = data.data
    path = tmp_path_factory.mktemp("m", numbered=True) / "x.tar"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            ours, damage, end = fgdata_members(f, total=len(data))
        for kw in ({"seekable": False}, {"seekable": True, "total": len(data)}):
            assert fgdata_members(io.BytesIO(data), **kw) == (ours, damage, end), kw
        with open(path, "rb") as f:
            assert fgdata_members(f, total=len(data), with_data=True) == (ours, damage, end)
        scan = scan_shard(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data) + 2 * MAX_EXTENSION_HEADER + (1 << 20)
    assert (scan.damage is None) == (damage is None)
    theirs = tarfile_members(data)
    event("fgdata: damage" if damage is not None else "fgdata: clean")
    event("tarfile: did not terminate" if theirs is None else "tarfile: raised" if theirs[1] else "tarfile: ended")
    if theirs is None:
        return
    tmembers, tfailed = theirs
    assert tmembers[: len(ours)] == ours
    if damage is None:
        assert tmembers == ours and (not tfailed or not data)
    else:  # the damage lies after fgdata's last member and no later than the data of tarfile's next one
        assert damage >= end
        if len(tmembers) > len(ours):
            assert damage <= tmembers[len(ours)][1]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_clean_archives_match_tarfile_exactly(fmt):
    long = "d/" + "n" * 120
    data = tarcraft.clean_tar([("a", {"txt": b"x" * 700, "json": b"{}"}), (long if fmt != tarfile.USTAR_FORMAT else "b",
                                                                            {"bin": b""})], fmt)
    ours, damage, _ = fgdata_members(io.BytesIO(data), seekable=False)
    assert damage is None
    assert tarfile_members(data) == (ours, False)

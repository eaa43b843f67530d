"""Hand-made tar bytes for scanner tests: raw headers with any field, checksums fixed or not."""

from __future__ import annotations

import io
import tarfile

BLOCK = 512


def fix_checksum(header: bytearray) -> None:
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header)


def raw_header(name: bytes, size_field: bytes, typeflag: bytes = b"0") -> bytearray:
    """A ustar header whose size field holds ``size_field`` verbatim (12 bytes, padded with NULs)."""
    h = bytearray(BLOCK)
    h[: len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size_field.ljust(12, b"\0")[:12]
    h[136:148] = b"00000000000\0"
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    fix_checksum(h)
    return h


def pax_record(key: str, value: str) -> bytes:
    """One well-formed PAX record (its length field counts itself)."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def member(name: str, data: bytes) -> bytes:
    """A regular member: header plus padded data."""
    return bytes(raw_header(name.encode(), b"%011o\0" % len(data))) + data + bytes(-len(data) % BLOCK)


def pax_header(records: bytes) -> bytes:
    """A PAX extended header ('x') carrying ``records`` verbatim."""
    return bytes(raw_header(b"././@PaxHeader", b"%011o\0" % len(records), b"x")) + records + bytes(-len(records) % BLOCK)


def clean_tar(samples: list[tuple[str, dict[str, bytes]]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A valid tar written by Python's tarfile, members in sample order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def header_offsets(data: bytes) -> list[int]:
    """Every header block of a clean archive (extension headers included), walking sizes."""
    out, pos = [], 0
    while pos + BLOCK <= len(data) and data[pos : pos + BLOCK] != bytes(BLOCK):
        out.append(pos)
        size = int(data[pos + 124 : pos + 136].split(b"\0", 1)[0].strip() or b"0", 8)
        pos += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    return out


def negative_size_shard() -> bytes:
    """2.5 KB: sample s0 (txt, json), then s1.txt whose size field is ``-0001000`` with a valid checksum."""
    return member("s0.txt", b"hello") + member("s0.json", b"{}") + bytes(raw_header(b"s1.txt", b"-0001000"))


def negative_pax_size_shard() -> bytes:
    """2.5 KB: sample s0 (txt), then a PAX header ``size=-1536`` before s1.txt."""
    return member("s0.txt", b"hello") + pax_header(pax_record("size", "-1536")) + bytes(
        raw_header(b"s1.txt", b"%011o\0" % 5)
    )

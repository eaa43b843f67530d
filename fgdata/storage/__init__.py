"""Local paths and ``s3://`` URLs behind one API: listing, streaming, atomic writes, a node cache.

S3 goes through the s5cmd binary with argument lists. Only the standard
library is imported here so ``fgdata --help`` stays fast.
"""

from fgdata.storage.cache import fetch_to_cache
from fgdata.storage.credentials import load_s3_credentials_file
from fgdata.storage.files import (
    FileInfo,
    atomic_path,
    download,
    exists,
    list_dir,
    list_recursive,
    make_dirs,
    open_read,
    read_bytes,
    read_text,
    remove,
    size,
    upload,
    write_bytes,
)
from fgdata.storage.paths import basename, is_s3, join, parent
from fgdata.storage.s5cmd import s5cmd_binary

__all__ = [
    "FileInfo",
    "atomic_path",
    "basename",
    "download",
    "exists",
    "fetch_to_cache",
    "is_s3",
    "join",
    "list_dir",
    "list_recursive",
    "load_s3_credentials_file",
    "make_dirs",
    "open_read",
    "parent",
    "read_bytes",
    "read_text",
    "remove",
    "s5cmd_binary",
    "size",
    "upload",
    "write_bytes",
]

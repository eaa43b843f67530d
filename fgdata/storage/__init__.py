"""Local paths and URLs (``s3://``) behind one API: listing, streaming, atomic writes, a node cache.

Each path goes to the backend of its URL scheme (:mod:`fgdata.storage.backend`); S3 goes
through the s5cmd binary with argument lists and bounded waits. Only the standard
library is imported here so ``fgdata --help`` stays fast.
"""

from fgdata.storage.backend import Backend, FileInfo, Folder, FolderLister, Unlisted, backend_for
from fgdata.storage.cache import fetch_to_cache
from fgdata.storage.credentials import load_s3_credentials_file
from fgdata.storage.files import (
    download,
    exists,
    is_dir,
    list_dir,
    list_names,
    list_recursive,
    list_tree,
    local_copy,
    make_dirs,
    move,
    open_read,
    publish,
    random_access,
    read_bytes,
    read_range,
    read_text,
    remove,
    remove_tree,
    size,
    stage,
    staging_dir,
    stat,
    tree_lister,
    upload,
    write_bytes,
)
from fgdata.storage.local import atomic_path, writing_to
from fgdata.storage.paths import (
    absolute,
    basename,
    is_absolute,
    is_s3,
    is_url,
    join,
    parent,
    relative,
    same_file_key,
)
from fgdata.storage.s5cmd import s5cmd_binary

__all__ = [
    "Backend",
    "FileInfo",
    "Folder",
    "FolderLister",
    "Unlisted",
    "absolute",
    "atomic_path",
    "backend_for",
    "basename",
    "download",
    "exists",
    "fetch_to_cache",
    "is_absolute",
    "is_dir",
    "is_s3",
    "is_url",
    "join",
    "list_dir",
    "list_names",
    "list_recursive",
    "list_tree",
    "load_s3_credentials_file",
    "local_copy",
    "make_dirs",
    "move",
    "open_read",
    "parent",
    "publish",
    "random_access",
    "read_bytes",
    "read_range",
    "read_text",
    "relative",
    "remove",
    "remove_tree",
    "s5cmd_binary",
    "same_file_key",
    "size",
    "stage",
    "staging_dir",
    "stat",
    "tree_lister",
    "upload",
    "write_bytes",
    "writing_to",
]

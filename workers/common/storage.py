"""fsspec access with storage options, and URL joining that works for paths and object-store URLs alike."""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec import AbstractFileSystem


def filesystem(url: str, storage_options: dict[str, Any]) -> tuple[AbstractFileSystem, str]:
    """The filesystem of `url` and the path within it."""
    return fsspec.core.url_to_fs(url, **storage_options)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def protocol_prefix(fs: AbstractFileSystem) -> str:
    """`s3://` etc. for remote filesystems, empty for the local one (paths stay plain paths)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return "" if protocol in ("file", "local") else f"{protocol}://"


def write_bytes(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Write a whole object; local parent folders are created (a no-op on object stores)."""
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, data)

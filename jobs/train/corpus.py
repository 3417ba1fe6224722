"""The training corpus: documents read from the stdlib or any fsspec URL, split by a stable rule.

The default corpus is the running interpreter's standard library sources: present on every
machine, offline, and under one licence (PSF). A document goes to the held-out split when a hash
of its relative path falls in the held-out share, so a file's side never depends on which other
files exist, on the listing order, or on the machine.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import platform
import sysconfig
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.train.config import CorpusConfig
from pipeline.errors import JobError

_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Document:
    key: str  # relative path (plus "#row" for Parquet rows): what the split hashes
    text: str


@dataclass
class Corpus:
    source: str  # what was read, for logs and model cards
    train: list[Document]
    heldout: list[Document]
    skipped_files: int  # files that were not UTF-8 text


def is_heldout(key: str, percent: float) -> bool:
    """Whether `key` belongs to the held-out split: its SHA-256 bucket in [0, 10000) is below percent·100.

    >>> is_heldout("json/decoder.py", 0.0), is_heldout("json/decoder.py", 100.0)
    (False, True)
    """
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 10_000
    return bucket < round(percent * 100)


def load_corpus(config: CorpusConfig) -> Corpus:
    """Read every document of the corpus and split it into train and held-out."""
    if not 0.0 <= config.heldout_percent < 100.0:
        raise JobError(f"corpus.heldout_percent={config.heldout_percent}: use a value in [0, 100)")
    url = config.url or sysconfig.get_paths()["stdlib"]
    source = config.url or f"Python {platform.python_version()} standard library ({url})"
    try:
        fs, path = fsspec.core.url_to_fs(url, **config.storage_options)
    except (ImportError, ValueError) as exc:
        raise JobError(f"corpus.url={url!r} cannot be opened: {exc}") from None
    files = _list_files(fs, path, config)
    documents: list[Document] = []
    skipped = 0
    for key, file_path in files:
        if file_path.endswith(".parquet"):
            documents.extend(_parquet_documents(fs, file_path, key, config.text_column))
            continue
        try:
            text = fs.cat_file(file_path).decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        if text:
            documents.append(Document(key, text))
    if not documents:
        raise JobError(f"corpus {source} holds no text: check corpus.url, corpus.include and corpus.text_column")
    train = [d for d in documents if not is_heldout(d.key, config.heldout_percent)]
    heldout = [d for d in documents if is_heldout(d.key, config.heldout_percent)]
    return Corpus(source=source, train=train, heldout=heldout, skipped_files=skipped)


def _list_files(fs: fsspec.AbstractFileSystem, path: str, config: CorpusConfig) -> list[tuple[str, str]]:
    """(relative key, path) of every corpus file, sorted by key, after exclusions and max_files."""
    if any(c in path for c in _GLOB_CHARS):
        root = path[: min(path.find(c) for c in _GLOB_CHARS if c in path)].rpartition("/")[0]
        paths = [p for p in fs.glob(path) if fs.isfile(p)]
    elif fs.isdir(path):
        root, paths = path, []
        for parent, dirs, names in fs.walk(path):
            dirs[:] = [d for d in dirs if d not in config.exclude_dirs]  # pruned, never listed
            paths += [f"{parent}/{n}" for n in names if any(fnmatch.fnmatch(n, pat) for pat in config.include)]
    elif fs.isfile(path):
        root, paths = path.rpartition("/")[0], [path]
    else:
        raise JobError(f"corpus.url: {path} does not exist; give a directory, a glob or a file")
    files = []
    for p in paths:
        key = p[len(root) :].lstrip("/")
        if not set(key.split("/")[:-1]) & set(config.exclude_dirs):
            files.append((key, p))
    files.sort()
    if config.max_files > 0:
        files = files[: config.max_files]
    if not files:
        raise JobError(
            f"corpus.url: no file under {path} matches corpus.include={config.include} "
            f"outside corpus.exclude_dirs={config.exclude_dirs}"
        )
    return files


def _parquet_documents(fs: fsspec.AbstractFileSystem, path: str, key: str, column: str) -> list[Document]:
    try:
        table = pq.read_table(io.BytesIO(fs.cat_file(path)))
    except Exception as exc:
        raise JobError(f"corpus file {path} is not readable Parquet: {exc}") from None
    if column not in table.column_names:
        raise JobError(
            f"corpus file {path} has no column {column!r} (columns: {table.column_names}); set corpus.text_column"
        )
    if not pa.types.is_string(table.schema.field(column).type) and not pa.types.is_large_string(
        table.schema.field(column).type
    ):
        raise JobError(f"corpus file {path}: column {column!r} is {table.schema.field(column).type}, not text")
    return [Document(f"{key}#{i}", text) for i, text in enumerate(table.column(column).to_pylist()) if text]

"""Input discovery and work-unit planning, from Parquet metadata alone (plus the id column, if any).

Everything that can make a job fail is checked here, before anything is written: a missing input, an
unreadable footer, a missing column, shards whose schemas differ, null or duplicate ids.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from pipeline.errors import JobError
from workers.common.contract import OUTPUT_SCHEMA, SCORE_COLUMNS, unit_id
from workers.common.spec import WorkUnit
from workers.common.storage import filesystem, protocol_prefix

T = TypeVar("T")
R = TypeVar("R")

_GLOB_CHARS = "*?["
# Footers are read concurrently: on object storage each is a request's round trip, and a real input
# can be thousands of shards. Bounded, so a listing of any size keeps a fixed number of requests open.
PLANNING_THREADS = 64
# One ranged read of a file's last bytes usually holds the whole footer; a larger footer costs a second.
FOOTER_READ_BYTES = 64 * 1024
_MAGIC = b"PAR1"


@dataclass(frozen=True)
class Shard:
    url: str  # readable by fsspec with the input storage options
    name: str  # path relative to the input root
    size: int
    stamp: str  # modification time or ETag: part of the job's identity
    num_rows: int
    row_group_rows: tuple[int, ...]
    schema: pa.Schema


@dataclass(frozen=True)
class Listing:
    """The data files of an input: their filesystem, paths (sorted), listing details and the root
    their names are relative to."""

    fs: AbstractFileSystem
    prefix: str  # protocol prefix of URLs on `fs` (`protocol_prefix`)
    paths: list[str]
    details: dict[str, dict[str, Any]]
    root: str

    def name(self, path: str) -> str:
        """A file's name relative to the input root (derived row ids start from it)."""
        return posixpath.relpath(path, self.root) if self.root else path

    def stamp(self, path: str) -> str:
        """The file's modification time or ETag: part of the job's identity."""
        info = self.details[path]
        return str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("etag") or "")


def list_data_files(url: str, storage_options: dict[str, Any], exclude: str | None = None) -> Listing:
    """The data files at `url` (a file, a directory searched recursively, or a glob), sorted by name.

    As in Spark, Hive and Hadoop, files and folders whose names start with `_` or `.` below the
    input root are not data (job markers, staging folders, editor and OS files). `exclude` (the
    job's output folder) is never listed, wherever it sits: an output inside the input folder must
    not feed the job its own parts.
    """
    fs, path = filesystem(url, storage_options)
    excluded = _same_filesystem_path(fs, exclude)
    if excluded and _is_within(_literal_prefix(path), excluded):
        raise JobError(
            f"input.url {url} lies inside output.url {exclude}: the output folder is never read as input; "
            "put the output beside or inside the input folder, not above it"
        )
    files, root = _list_files(fs, url, path)
    paths = sorted(p for p in files if not (excluded and _is_within(p, excluded)))
    if not paths:
        raise JobError(
            f"input.url {url} matches no data files (files and folders named _* or .*, and the output "
            "folder, are skipped)"
        )
    return Listing(fs, protocol_prefix(fs), paths, files, root)


def list_shards(
    url: str, storage_options: dict[str, Any], exclude: str | None = None, threads: int = PLANNING_THREADS
) -> list[Shard]:
    """The Parquet shards at `url` (`list_data_files`), sorted by name; footers are read by `threads`
    concurrent ranged reads."""
    return read_shards(list_data_files(url, storage_options, exclude), threads)


def read_shards(listing: Listing, threads: int = PLANNING_THREADS) -> list[Shard]:
    """The listed files as Parquet shards, their footers read by `threads` concurrent ranged reads."""
    return parallel_map(lambda p: _read_shard(listing, p), listing.paths, threads)


def parallel_map(fn: Callable[[T], R], items: list[T], threads: int) -> list[R]:
    """`fn` over `items` in order, on up to `threads` threads (the first error raised is the first in order)."""
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


def _list_files(fs: AbstractFileSystem, url: str, path: str) -> tuple[dict[str, dict[str, Any]], str]:
    """Every data file of the input with its listing details (size, stamp), and the root names are
    relative to. A file named explicitly is data whatever its name; below a folder or a glob's root,
    names starting with `_` or `.` are not.

    One listing gives every file's size and stamp, so no file needs a request of its own for them.
    """
    if any(c in path for c in _GLOB_CHARS):
        root = _literal_prefix(path).rsplit("/", 1)[0]
        found = fs.glob(path, detail=True)
    elif fs.isdir(path):
        root = path.rstrip("/")
        found = fs.find(root, detail=True)
    elif fs.exists(path):
        return {path: fs.info(path)}, posixpath.dirname(path)
    else:
        raise JobError(
            f"input.url {url} does not exist: point it at a Parquet or JSON Lines file, a folder of them, or a glob"
        )
    return {p: info for p, info in found.items() if info.get("type") == "file" and not _is_hidden(p, root)}, root


def _literal_prefix(path: str) -> str:
    """The part of a path before its first glob character (all of it when there is none)."""
    return path[: min((path.find(c) for c in _GLOB_CHARS if c in path), default=len(path))]


def _is_hidden(path: str, root: str) -> bool:
    """A name below the root starting with `_` or `.` (the root itself may be named so: the user chose it).

    Spark, Hive and Hadoop write such names for job markers, staging and checksums, and so does accelgen.
    """
    relative = posixpath.relpath(path, root) if root else path
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def _same_filesystem_path(fs: AbstractFileSystem, url: str | None) -> str | None:
    """`url` as a path of `fs` when it lives on the same kind of filesystem, else None (cannot overlap)."""
    if not url:
        return None
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if protocol not in protocols and not (protocol == "file" and "local" in protocols):
        return None
    return fs._strip_protocol(url).rstrip("/")


def _is_within(path: str, folder: str) -> bool:
    return path.rstrip("/") == folder or path.startswith(folder + "/")


def _read_shard(listing: Listing, path: str) -> Shard:
    url = listing.prefix + path
    size = int(listing.details[path].get("size") or 0)
    try:
        meta = read_footer(listing.fs, path, size)
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:
        raise JobError(f"cannot read the Parquet footer of {url}: {exc}; fix or remove the file") from None
    return Shard(
        url=url,
        name=listing.name(path),
        size=size,
        stamp=listing.stamp(path),
        num_rows=meta.num_rows,
        row_group_rows=tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups)),
        schema=schema,
    )


def read_footer(fs: AbstractFileSystem, path: str, size: int) -> pq.FileMetaData:
    """A Parquet file's metadata from ranged reads of its end: one request for most files, two at most.

    Opening the file instead would cost a metadata request and a read per file, one after another.
    """
    if size < 2 * len(_MAGIC) + 4:
        raise ValueError(f"{size} bytes is too small for a Parquet file")
    tail = fs.cat_file(path, start=max(0, size - FOOTER_READ_BYTES), end=size)
    if tail[-4:] != _MAGIC:
        raise ValueError("the file does not end with the Parquet magic bytes PAR1 (not Parquet, or encrypted)")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 + len(_MAGIC) > size:
        raise ValueError(f"its footer claims {length} bytes, more than the file's {size}")
    if length + 8 > len(tail):
        tail = fs.cat_file(path, start=size - length - 8, end=size)
    # The metadata parser wants a whole file: the leading magic and the footer are all it reads.
    return pq.read_metadata(pa.BufferReader(_MAGIC + tail[-(length + 8) :]))


def check_columns(
    shards: list[Shard],
    prompt_column: str,
    id_column: str | None,
    keep_columns: list[str],
    strategy_column: str | None = None,
    params_columns: dict[str, str] | None = None,
    messages_column: str | None = None,
) -> None:
    """Fail the job unless every shard has the same schema and the configured columns are usable.

    With `messages_column` the prompts are chat messages and `prompt_column` is not read."""
    first = shards[0]
    for shard in shards[1:]:
        if not shard.schema.remove_metadata().equals(first.schema.remove_metadata()):
            raise JobError(
                f"schema of {shard.url} differs from {first.url}:\n  {_describe(shard.schema)}\n  vs\n  "
                f"{_describe(first.schema)}\nmake every shard of the input share one schema"
            )
    names = first.schema.names
    wanted = {"input.keep_columns": keep_columns}
    if messages_column:
        wanted["input.messages_column"] = [messages_column]
    else:
        wanted["input.prompt_column"] = [prompt_column]
    if id_column:
        wanted["input.id_column"] = [id_column]
    if strategy_column:
        wanted["input.strategy_column"] = [strategy_column]
    for setting, column in (params_columns or {}).items():
        wanted[f"input.params_columns.{setting}"] = [column]
    for key, columns in wanted.items():
        for column in columns:
            if column not in names:
                raise JobError(f"{key}: column {column!r} is not in {first.url} (columns: {', '.join(names)})")
    if messages_column:
        _check_messages_type(first.schema.field(messages_column).type, messages_column, first.url)
    else:
        prompt_type = first.schema.field(prompt_column).type
        if not (_is_text(prompt_type) or _is_binary(prompt_type)):
            raise JobError(f"input.prompt_column {prompt_column!r} of {first.url} is {prompt_type}, not text")
    clashing = sorted(set(keep_columns) & {*OUTPUT_SCHEMA.names, *SCORE_COLUMNS.names})
    if clashing:
        raise JobError(f"input.keep_columns {clashing} clash with output columns; rename them in the input")


def _check_messages_type(t: pa.DataType, column: str, url: str) -> None:
    """Chat messages are text (JSON) or a list of structs with `role` and `content` fields."""
    if _is_text(t):
        return
    fields = {t.value_type.field(i).name for i in range(t.value_type.num_fields)} if _is_struct_list(t) else None
    if fields is None or not {"role", "content"} <= fields:
        raise JobError(
            f"input.messages_column {column!r} of {url} is {t}: it must hold a list of structs with fields "
            "role and content (or JSON text of one), e.g. [{role: user, content: ...}]"
        )


def _is_struct_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def check_ids(
    shards: list[Shard], id_column: str, storage_options: dict[str, Any], threads: int = PLANNING_THREADS
) -> None:
    """Fail the job on a null or duplicate id, naming the rows (file and row index).

    The ids are held as Arrow arrays (a few bytes beyond the id's own length per row), not as Python
    objects: a million-row input is checked in tens of megabytes.
    """
    columns = read_ids(shards, id_column, storage_options, threads)
    for shard, ids in zip(shards, columns, strict=True):
        if ids.null_count:
            index = pc.index(pc.is_null(ids), True).as_py()
            raise JobError(f"input.id_column {id_column!r} is null in {shard.url} row {index}: give every row an id")
    counts = pc.value_counts(pa.chunked_array([c for ids in columns for c in ids.chunks], type=columns[0].type))
    duplicated = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    if not len(duplicated):
        return
    examples = duplicated[:5]
    places: dict[str, list[str]] = {str(v): [] for v in examples.to_pylist()}
    for shard, ids in zip(shards, columns, strict=True):
        for index in pc.indices_nonzero(pc.is_in(ids, value_set=examples)).to_pylist():
            places[str(ids[index].as_py())].append(f"{shard.url} row {index}")
    raise JobError(
        f"input.id_column {id_column!r} has {len(duplicated)} duplicate ids, e.g. "
        + "; ".join(f"{key!r} at " + _some(where) for key, where in places.items())
        + ": ids must be unique across the input"
    )


def _some(places: list[str]) -> str:
    shown = 3
    more = f" and {len(places) - shown} more" if len(places) > shown else ""
    return ", ".join(places[:shown]) + more


def read_ids(
    shards: list[Shard], id_column: str, storage_options: dict[str, Any], threads: int = PLANNING_THREADS
) -> list[pa.ChunkedArray]:
    """The id column of every shard, read concurrently, in the order of `shards`. A small shard is
    fetched whole in one request; opening it would cost a metadata request and reads besides."""

    def read(shard: Shard) -> pa.ChunkedArray:
        fs, path = filesystem(shard.url, storage_options)
        if shard.size <= FOOTER_READ_BYTES:
            return pq.ParquetFile(pa.BufferReader(fs.cat_file(path))).read(columns=[id_column]).column(id_column)
        with fs.open(path, "rb") as f:
            return pq.ParquetFile(f).read(columns=[id_column]).column(id_column)

    return parallel_map(read, shards, threads)


def plan_units(shards: list[Shard], rows_per_unit: int) -> list[WorkUnit]:
    """One unit per shard, or runs of whole row groups of about `rows_per_unit` rows for large shards.

    Unit ids come from the shard's position in the sorted listing and its first row group
    (`contract.unit_id`), so the same input always plans the same units.
    """
    units = []
    for index, shard in enumerate(shards):
        groups: list[int] = []
        first_row = rows = 0
        for group, group_rows in enumerate(shard.row_group_rows):
            if groups and rows + group_rows > rows_per_unit:
                units.append(_unit(shard, index, groups, first_row, rows))
                first_row, groups, rows = first_row + rows, [], 0
            groups.append(group)
            rows += group_rows
        if groups and rows:
            units.append(_unit(shard, index, groups, first_row, rows))
    return units


def _unit(shard: Shard, index: int, groups: list[int], first_row: int, rows: int) -> WorkUnit:
    return WorkUnit(
        unit_id=unit_id(index, groups[0]),
        shard_url=shard.url,
        shard_name=shard.name,
        row_groups=tuple(groups),
        first_row=first_row,
        num_rows=rows,
    )

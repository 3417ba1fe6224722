"""Input discovery and work-unit planning, from Parquet metadata alone (plus the id column, if any).

Everything that can make a job fail is checked here, before anything is written: a missing input, an
unreadable footer, a missing column, shards whose schemas differ, null or duplicate ids.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem

from pipeline.errors import JobError
from workers.generator import OUTPUT_SCHEMA
from workers.spec import WorkUnit
from workers.storage import filesystem, protocol_prefix

_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Shard:
    url: str  # readable by fsspec with the input storage options
    name: str  # path relative to the input root
    size: int
    stamp: str  # modification time or ETag: part of the job's identity
    num_rows: int
    row_group_rows: tuple[int, ...]
    schema: pa.Schema


def list_shards(url: str, storage_options: dict[str, Any]) -> list[Shard]:
    """The Parquet shards at `url` (a file, a directory searched recursively, or a glob), sorted by name."""
    fs, path = filesystem(url, storage_options)
    prefix = protocol_prefix(fs)
    if any(c in path for c in _GLOB_CHARS):
        paths = sorted(fs.glob(path))
        root = path[: min(path.find(c) for c in _GLOB_CHARS if c in path)].rsplit("/", 1)[0]
    elif fs.isdir(path):
        paths = sorted(p for p in fs.find(path) if _is_data_file(p))
        root = path.rstrip("/")
    elif fs.exists(path):
        paths, root = [path], posixpath.dirname(path)
    else:
        raise JobError(f"input.url {url} does not exist: point it at a Parquet file, a folder of them, or a glob")
    if not paths:
        raise JobError(f"input.url {url} matches no Parquet files (files named _* or .* are skipped)")
    return [_read_shard(fs, prefix, p, root) for p in paths]


def _is_data_file(path: str) -> bool:
    name = posixpath.basename(path)
    return not name.startswith(("_", ".")) and "/_" not in path and "/." not in path


def _read_shard(fs: AbstractFileSystem, prefix: str, path: str, root: str) -> Shard:
    url = prefix + path
    try:
        info = fs.info(path)
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
    except Exception as exc:
        raise JobError(f"cannot read the Parquet footer of {url}: {exc}; fix or remove the file") from None
    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("etag") or ""
    name = posixpath.relpath(path, root) if root else path
    return Shard(
        url=url,
        name=name,
        size=int(info.get("size") or 0),
        stamp=str(stamp),
        num_rows=meta.num_rows,
        row_group_rows=tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups)),
        schema=schema,
    )


def check_columns(
    shards: list[Shard],
    prompt_column: str,
    id_column: str | None,
    keep_columns: list[str],
    strategy_column: str | None = None,
) -> None:
    """Fail the job unless every shard has the same schema and the configured columns are usable."""
    first = shards[0]
    for shard in shards[1:]:
        if not shard.schema.remove_metadata().equals(first.schema.remove_metadata()):
            raise JobError(
                f"schema of {shard.url} differs from {first.url}:\n  {_describe(shard.schema)}\n  vs\n  "
                f"{_describe(first.schema)}\nmake every shard of the input share one schema"
            )
    names = first.schema.names
    wanted = {"input.prompt_column": [prompt_column], "input.keep_columns": keep_columns}
    if id_column:
        wanted["input.id_column"] = [id_column]
    if strategy_column:
        wanted["input.strategy_column"] = [strategy_column]
    for key, columns in wanted.items():
        for column in columns:
            if column not in names:
                raise JobError(f"{key}: column {column!r} is not in {first.url} (columns: {', '.join(names)})")
    prompt_type = first.schema.field(prompt_column).type
    if not (pa.types.is_string(prompt_type) or pa.types.is_large_string(prompt_type) or _is_binary(prompt_type)):
        raise JobError(f"input.prompt_column {prompt_column!r} of {first.url} is {prompt_type}, not text")
    clashing = sorted(set(keep_columns) & set(OUTPUT_SCHEMA.names))
    if clashing:
        raise JobError(f"input.keep_columns {clashing} clash with output columns; rename them in the input")


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def check_ids(shards: list[Shard], id_column: str, storage_options: dict[str, Any]) -> None:
    """Fail the job on a null or duplicate id, naming the rows (file and row index)."""
    seen: dict[str, tuple[str, int]] = {}
    duplicates: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for shard in shards:
        fs, path = filesystem(shard.url, storage_options)
        with fs.open(path, "rb") as f:
            ids = pq.ParquetFile(f).read(columns=[id_column]).column(id_column).to_pylist()
        for index, value in enumerate(ids):
            if value is None:
                raise JobError(
                    f"input.id_column {id_column!r} is null in {shard.url} row {index}: give every row an id"
                )
            key = str(value)
            if key in seen:
                duplicates[key].append((shard.url, index))
            else:
                seen[key] = (shard.url, index)
    if duplicates:
        examples = [
            f"{key!r} at " + ", ".join(f"{u} row {i}" for u, i in [seen[key], *places])
            for key, places in list(duplicates.items())[:5]
        ]
        raise JobError(
            f"input.id_column {id_column!r} has {len(duplicates)} duplicate ids, e.g. "
            + "; ".join(examples)
            + ": ids must be unique across the input"
        )


def plan_units(shards: list[Shard], rows_per_unit: int) -> list[WorkUnit]:
    """One unit per shard, or runs of whole row groups of about `rows_per_unit` rows for large shards.

    Unit ids come from the shard's position in the sorted listing and its first row group, so the
    same input always plans the same units (that is what makes resume and retries idempotent).
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
        unit_id=f"{index:05d}-{groups[0]:05d}",
        shard_url=shard.url,
        shard_name=shard.name,
        row_groups=tuple(groups),
        first_row=first_row,
        num_rows=rows,
    )

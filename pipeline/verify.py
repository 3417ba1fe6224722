"""`accelgen verify`: check a job's output against the output contract, from the outside.

All must hold: the job finished (`_SUCCESS` and `_manifest.json`); every part in the manifest
exists with its recorded size, sha256 and row count; no data file sits outside the manifest
(`_logs/` and the job's own bookkeeping aside); every `row_id` appears exactly `generation.n` times,
once with each `sample_index` in 0..n-1 (n = 1: exactly once); and, given the input, the output's
row ids are exactly the input's.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from fsspec import AbstractFileSystem

from pipeline.commit import JOB_FILE, MANIFEST_FILE
from pipeline.input_formats import resolve_format, scan_text_shards, text_row_ids
from pipeline.markers import SUCCESS_FILE
from pipeline.shards import list_data_files, parallel_map, read_ids, read_shards
from workers.common.contract import derived_row_id, row_ids_of_id_column
from workers.common.output_formats import read_part_rows
from workers.common.storage import filesystem, join

_BOOKKEEPING = (JOB_FILE, MANIFEST_FILE, SUCCESS_FILE)
_BOOKKEEPING_DIRS = ("_logs/", "_commits/")
_THREADS = 16  # parts read at once: each is a whole object, so fewer at a time than footers
_NO_ROWS = pa.table({"row_id": pa.array([], pa.string()), "sample_index": pa.array([], pa.int64())})


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    parts: int = 0
    rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(output_url: str, input_url: str | None, storage_options: dict[str, Any]) -> Report:
    report = Report()
    fs, root = filesystem(output_url, storage_options)
    root = root.rstrip("/")
    fs.invalidate_cache()
    if not fs.exists(join(root, SUCCESS_FILE)):
        report.problems.append(f"{SUCCESS_FILE} is missing: the job did not finish")
    try:
        manifest = json.loads(fs.cat_file(join(root, MANIFEST_FILE)))
    except FileNotFoundError:
        report.problems.append(f"{MANIFEST_FILE} is missing")
        return report
    listed = {p["part"]: p for p in manifest["parts"]}
    present = {posixpath.relpath(path, root) for path in fs.find(root)}
    for name in sorted(present):
        if name in _BOOKKEEPING or name.startswith(_BOOKKEEPING_DIRS) or name in listed:
            continue
        report.problems.append(f"{name} is not in the manifest")
    for name in sorted(set(listed) - present):
        report.problems.append(f"{name} is in the manifest but missing")
    config = manifest["config"]
    samples, output_format = config["generation"].get("n", 1), config["output"].get("format", "parquet")
    checked = parallel_map(
        lambda n: _check_part(fs, join(root, n), listed[n], output_format, samples),
        sorted(set(listed) & present),
        _THREADS,
    )
    report.problems.extend(problem for problem, _ in checked if problem)
    rows = pa.concat_tables([part_rows for _, part_rows in checked if part_rows is not None] or [_NO_ROWS])
    ids = rows.column("row_id")
    report.parts, report.rows = sum(not problem for problem, _ in checked), len(ids)
    report.problems.extend(_sample_problems(rows, samples))
    if input_url is not None:
        expected = input_row_ids(input_url, manifest, storage_options, exclude=output_url)
        missing = expected.filter(pc.invert(pc.is_in(expected, value_set=ids)))
        extra = ids.filter(pc.invert(pc.is_in(ids, value_set=expected)))
        if len(missing):
            report.problems.append(f"{len(missing)} input rows have no output row, e.g. {_first(missing)}")
        if len(extra):
            report.problems.append(f"{len(extra)} output rows match no input row, e.g. {_first(extra)}")
    return report


def _sample_problems(rows: pa.Table, n: int) -> list[str]:
    """Each row id once per sample: n times, with sample indices 0..n-1 (unique pairs, all in range)."""
    ids, samples = rows.column("row_id"), rows.column("sample_index")
    counts = pc.value_counts(ids)
    if n == 1:
        wrong = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
        return [f"{len(wrong)} row ids appear more than once, e.g. {wrong[:3].to_pylist()}"] if len(wrong) else []
    problems = []
    wrong = counts.filter(pc.not_equal(counts.field("counts"), n)).field("values")
    if len(wrong):
        problems.append(f"{len(wrong)} row ids do not have generation.n={n} output rows, e.g. {wrong[:3].to_pylist()}")
    outside = pc.sum(pc.or_(pc.less(samples, 0), pc.greater_equal(samples, n))).as_py() or 0
    if outside:
        problems.append(f"{outside} rows have a sample_index outside 0..{n - 1}")
    pairs = pc.value_counts(pc.binary_join_element_wise(ids, pc.cast(samples, pa.string()), "\x00"))
    repeated = pairs.filter(pc.greater(pairs.field("counts"), 1)).field("values")
    if len(repeated):
        example = [p.replace("\x00", " sample ") for p in repeated[:3].to_pylist()]
        problems.append(f"{len(repeated)} (row_id, sample_index) pairs appear more than once, e.g. {example}")
    return problems


def _check_part(
    fs: AbstractFileSystem, path: str, part: dict[str, Any], output_format: str, samples: int
) -> tuple[str | None, pa.Table | None]:
    """A part against its manifest entry: (the problem or None, its row ids and sample indices; None when
    the bytes differ)."""
    name = part["part"]
    data = fs.cat_file(path)
    if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
        return f"{name}: checksum differs from the manifest", None
    try:
        rows = read_part_rows(data, output_format, ["row_id", "sample_index"], samples)
    except Exception as exc:
        return f"{name}: not a readable {output_format} part ({exc})", None
    if rows.num_rows != part["rows"]:
        return f"{name}: {rows.num_rows} rows, the manifest says {part['rows']}", rows
    return None, rows


def _first(ids: pa.ChunkedArray) -> list[str]:
    return ids.take(pc.sort_indices(ids)[:3]).to_pylist()


def input_row_ids(
    input_url: str, manifest: dict[str, Any], storage_options: dict[str, Any], exclude: str | None = None
) -> pa.ChunkedArray:
    """The row ids a job over `input_url` must produce, with the job's own id rule (its id column, or
    shard path and row index). `exclude` is the job's output folder, which its listing left out."""
    config = manifest["config"]["input"]
    id_column = config["id_column"]
    listing = list_data_files(input_url, storage_options, exclude=exclude)
    input_format = resolve_format(config.get("format"), listing, input_url)
    if input_format != "parquet":
        return text_row_ids(scan_text_shards(listing, input_format, config["rows_per_unit"], id_column, True))
    shards = read_shards(listing)
    if id_column:
        columns = [row_ids_of_id_column(ids) for ids in read_ids(shards, id_column, storage_options)]
    else:
        columns = [
            pa.chunked_array([pa.array([derived_row_id(s.name, i) for i in range(s.num_rows)], pa.string())])
            for s in shards
        ]
    return pa.chunked_array([c for ids in columns for c in ids.chunks], type=pa.string())

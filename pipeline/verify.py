"""`accelgen verify`: check a job's output against the output contract, from the outside.

All must hold: the job finished (`_SUCCESS` and `_manifest.json`); every part in the manifest
exists with its recorded size, sha256 and row count; no data file sits outside the manifest
(`_logs/` and the job's own bookkeeping aside); every `row_id` appears exactly once; and, given the
input, the output's row ids are exactly the input's.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from pipeline.commit import JOB_FILE, MANIFEST_FILE, SUCCESS_FILE
from pipeline.shards import list_shards
from workers.generator import derived_row_id
from workers.storage import filesystem, join

_BOOKKEEPING = (JOB_FILE, MANIFEST_FILE, SUCCESS_FILE)
_BOOKKEEPING_DIRS = ("_logs/", "_commits/")


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
    ids: Counter[str] = Counter()
    for name, part in sorted(listed.items()):
        if name not in present:
            report.problems.append(f"{name} is in the manifest but missing")
            continue
        data = fs.cat_file(join(root, name))
        if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
            report.problems.append(f"{name}: checksum differs from the manifest")
            continue
        table = pq.read_table(io.BytesIO(data), columns=["row_id"])
        if table.num_rows != part["rows"]:
            report.problems.append(f"{name}: {table.num_rows} rows, the manifest says {part['rows']}")
        ids.update(table.column("row_id").to_pylist())
        report.parts += 1
    report.rows = sum(ids.values())
    duplicated = [i for i, n in ids.items() if n > 1]
    if duplicated:
        report.problems.append(f"{len(duplicated)} row ids appear more than once, e.g. {duplicated[:3]}")
    if input_url is not None:
        expected = input_row_ids(input_url, manifest, storage_options)
        missing, extra = expected - set(ids), set(ids) - expected
        if missing:
            report.problems.append(f"{len(missing)} input rows have no output row, e.g. {sorted(missing)[:3]}")
        if extra:
            report.problems.append(f"{len(extra)} output rows match no input row, e.g. {sorted(extra)[:3]}")
    return report


def input_row_ids(input_url: str, manifest: dict[str, Any], storage_options: dict[str, Any]) -> set[str]:
    """The row ids a job over `input_url` must produce, with the job's own id rule (its id column, or
    shard path and row index)."""
    id_column = manifest["config"]["input"]["id_column"]
    expected: set[str] = set()
    for shard in list_shards(input_url, storage_options):
        if id_column:
            fs, path = filesystem(shard.url, storage_options)
            with fs.open(path, "rb") as f:
                expected.update(str(v) for v in pq.read_table(f, columns=[id_column]).column(id_column).to_pylist())
        else:
            expected.update(derived_row_id(shard.name, i) for i in range(shard.num_rows))
    return expected

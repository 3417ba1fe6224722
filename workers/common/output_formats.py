"""The formats a committed part is written in (`output.format`), and how each is read back.

The actor encodes a part's rows once, in the job's format; `accelgen verify` and `accelgen report`
read any part back as the contract's columns, so they work on every format alike.

- `parquet`: the output contract's columns (`contract.output_schema`), one row per sample.
- `jsonl`: the same columns, one JSON object per line and per sample.
- `openai_batch`: the OpenAI Batch API's response lines, one per input row, its samples as choices
  (`workers/common/openai_batch.py`).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import time
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from workers.common.contract import OUTPUT_SCHEMA
from workers.common.openai_batch import response_line, rows_of_response

OUTPUT_FORMATS = ("parquet", "jsonl", "openai_batch")


def part_suffix(output_format: str) -> str:
    """The file name ending of a part in `output_format`."""
    return ".parquet" if output_format == "parquet" else ".jsonl"


@dataclass(frozen=True)
class ResponseContext:
    """What Batch API response lines say beyond the rows: which requests were chat requests (one flag
    per input row of the part), the model that answered, and the job (which keys the lines' ids)."""

    chat: list[bool]
    model: str
    job_id: str


def encode_part(table: pa.Table, output_format: str, responses: ResponseContext | None = None) -> bytes:
    """A part's bytes: `table` (the part's output rows) in `output_format`."""
    if output_format == "parquet":
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()
    rows = table.to_pylist()
    if output_format == "openai_batch":
        if responses is None:
            raise ValueError("openai_batch parts need a ResponseContext")
        created = int(time.time())
        by_request = [list(group) for _, group in groupby(rows, key=lambda r: r["row_id"])]
        rows = [
            response_line(group, chat, responses.model, responses.job_id, created)
            for group, chat in zip(by_request, responses.chat, strict=True)
        ]
    return "".join(json.dumps(row, ensure_ascii=False, default=_plain) + "\n" for row in rows).encode()


def _plain(value: object) -> Any:
    """A kept input value JSON has no type for, as text (bytes: UTF-8, or base64 when they are not)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    raise TypeError(f"{type(value).__name__} values cannot be written as JSON")


def read_part_rows(data: bytes, output_format: str, columns: list[str], samples: int) -> pa.Table:
    """The `columns` (contract columns) of a part's rows, whatever its format. `samples`: the job's
    generation.n, the rows an error line of a Batch API part stands for. Parts written before
    `sample_index` existed hold sample 0 of each row."""
    schema = pa.schema([OUTPUT_SCHEMA.field(name) for name in columns])
    if output_format == "parquet":
        file = pq.ParquetFile(pa.BufferReader(data))
        present = [c for c in columns if c in file.schema_arrow.names]
        table = file.read(columns=present)
        if "sample_index" in columns and "sample_index" not in present:
            table = table.append_column("sample_index", pa.array([0] * table.num_rows, pa.int64()))
        return table.select(columns).cast(schema)
    lines = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    if output_format == "openai_batch":
        lines = [row for line in lines for row in rows_of_response(line, samples)]
    return pa.table({name: [row.get(name) for row in lines] for name in columns}, schema=schema)

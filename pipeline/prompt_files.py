"""Prompts read from a file by column: a Parquet file, or JSONL (optionally gzipped) with one object a line.

The commands that decode prompts outside a job (`accelgen bench`, `accelgen calibrate`, the device
check) read them here, so a prompt file that one accepts the others accept too."""

from __future__ import annotations

import gzip
import json

from workers.common.storage import filesystem


def read_prompts(url: str, column: str) -> list[str]:
    """Every prompt of the file at `url` (local path or fsspec URL) in `column`, in file order; Parquet
    rows with an empty or missing prompt are left out."""
    fs, path = filesystem(url, {})
    if path.endswith((".jsonl", ".jsonl.gz")):
        with fs.open(path, "rb") as f:
            data = gzip.decompress(f.read()) if path.endswith(".gz") else f.read()
        return [json.loads(line)[column] for line in data.decode("utf-8").splitlines() if line.strip()]
    import pyarrow.parquet as pq

    with fs.open(path, "rb") as f:
        return [p for p in pq.read_table(f, columns=[column]).column(column).to_pylist() if p]

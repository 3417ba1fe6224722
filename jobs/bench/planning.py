"""Planning at scale: write many small shards to a local S3 endpoint (moto), then plan them as the driver does.

    python -m jobs.bench.planning [shards=10000] [rows_per_shard=100] [threads=64] [ids=true]

Planning is the driver's listing, footer reads, schema and id checks and unit planning
(`pipeline.shards`), run in a fresh process whose time and peak memory are printed. Not a test:
it takes about a minute and writes 10,000 objects.
"""

from __future__ import annotations

import io
import itertools
import sys
import time
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.bench.scale import LocalS3, bench_main, measured, resident_mb
from pipeline.shards import PLANNING_THREADS, check_columns, check_ids, list_shards, plan_units
from strategies.config_option import option
from workers.common.storage import filesystem

BUCKET = "bench-planning"


@dataclass
class PlanningBench:
    shards: int = option(10_000, "Shards written and planned.")
    rows_per_shard: int = option(100, "Rows of each shard (10,000 x 100: a million rows).")
    threads: int = option(PLANNING_THREADS, "Concurrent footer and id reads (1: one after another).")
    ids: bool = option(True, "Give the shards an id column and check it as the driver does (input.id_column).")


def main(args: list[str]) -> int:
    return bench_main(__doc__, PlanningBench(), args, _run)


def _run(bench: PlanningBench) -> int:
    with LocalS3() as s3:
        options = s3.storage_options()
        started = time.perf_counter()
        _write_shards(options, bench)
        print(f"wrote {bench.shards} shards of {bench.rows_per_shard} rows in {time.perf_counter() - started:.1f}s")
        result = measured(plan, f"s3://{BUCKET}/in", options, bench)
    rows = bench.shards * bench.rows_per_shard
    grown = result["peak_mb"] - result["ready_mb"]
    print(
        f"planned {result['shards']} shards, {result['units']} units, {rows} rows with {bench.threads} threads in "
        f"{result['total_s']:.1f}s (listing and footers {result['list_s']:.1f}s, schemas {result['columns_s']:.1f}s, "
        f"ids {result['ids_s']:.1f}s, units {result['units_s']:.2f}s)"
    )
    print(
        f"driver memory: peak {result['peak_mb']:.0f} MB resident, {result['baseline_mb']:.0f} MB after imports, "
        f"{result['ready_mb']:.0f} MB with an S3 client: "
        f"{grown:.0f} MB for planning = {grown / rows * 1e6:.0f} MB per million rows in shards of "
        f"{bench.rows_per_shard} rows ({grown / bench.shards * 1e3:.1f} kB per shard)"
    )
    return 0


def _write_shards(options: dict[str, Any], bench: PlanningBench) -> None:
    """Small Parquet shards, put in concurrent batches (s3fs's `pipe` of many objects)."""
    fs = fsspec.filesystem("s3", **options)
    fs.mkdir(BUCKET)
    batch: dict[str, bytes] = {}
    for n in range(bench.shards):
        batch[f"{BUCKET}/in/part-{n:06d}.parquet"] = _shard(n, bench)
        if len(batch) == 500 or n == bench.shards - 1:
            fs.pipe(batch)
            batch = {}


def _shard(n: int, bench: PlanningBench) -> bytes:
    first = n * bench.rows_per_shard
    columns = {"prompt": [f"def f{i}(x):" for i in range(first, first + bench.rows_per_shard)]}
    if bench.ids:
        columns["id"] = [f"row-{i}" for i in range(first, first + bench.rows_per_shard)]
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()


def plan(url: str, options: dict[str, Any], bench: PlanningBench) -> dict[str, Any]:
    """The driver's planning steps, each timed (run in a process of its own by `measured`)."""
    filesystem(url, options)[0].ls(BUCKET)  # the client's fixed cost, paid before `ready_mb`
    ready_mb = resident_mb()
    times = [time.perf_counter()]
    shards = list_shards(url, options, threads=bench.threads)
    times.append(time.perf_counter())
    check_columns(shards, "prompt", "id" if bench.ids else None, [])
    times.append(time.perf_counter())
    if bench.ids:
        check_ids(shards, "id", options, threads=bench.threads)
    times.append(time.perf_counter())
    units = plan_units(shards, 4096)
    times.append(time.perf_counter())
    steps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "shards": len(shards),
        "units": len(units),
        "list_s": steps[0],
        "columns_s": steps[1],
        "ids_s": steps[2],
        "units_s": steps[3],
        "total_s": times[-1] - times[0],
        "ready_mb": ready_mb,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

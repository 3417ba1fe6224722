"""A million-row job's bookkeeping: commits, manifest and `accelgen verify`, with the actor simulated.

    python -m jobs.bench.bookkeeping [rows=1000000] [shards=100] [rows_per_unit=500] [s3=false]

The driver's own steps run for real (listing, planning, claim, one publish and commit record per
unit, the resume check, the manifest and `_SUCCESS`), then `verify` with the input; the actor is
replaced by one that stages, for each unit, a part of one-token completions. Each phase runs in a
fresh process whose time and peak memory are printed. Not a test: it writes 2,000 parts.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.bench.scale import LocalS3, bench_main, measured, resident_mb
from jobs.shipped import default_job_config
from pipeline.commit import MANIFEST_FILE, OutputFolder
from pipeline.config import load_config, to_plain_dict
from pipeline.fingerprint import fingerprint, identity
from pipeline.shards import list_shards, plan_units
from pipeline.verify import verify
from strategies.config_option import option
from workers.common.contract import OUTPUT_SCHEMA, derived_row_id
from workers.common.spec import UnitResult, WorkUnit
from workers.common.storage import filesystem, join, write_bytes


@dataclass
class BookkeepingBench:
    rows: int = option(1_000_000, "Rows of the job.")
    shards: int = option(100, "Input shards the rows are spread over.")
    rows_per_unit: int = option(500, "input.rows_per_unit; shards are written in row groups of this size.")
    s3: bool = option(False, "Input and output on a local S3 endpoint (moto) instead of a local folder.")


def main(args: list[str]) -> int:
    return bench_main(__doc__, BookkeepingBench(), args, _run_on_storage)


def _run_on_storage(bench: BookkeepingBench) -> int:
    if bench.s3:
        with LocalS3() as s3:
            filesystem("s3://bookkeeping", s3.storage_options())[0].mkdir("bookkeeping")
            return _run("s3://bookkeeping", s3.storage_options(), bench)
    with tempfile.TemporaryDirectory() as folder:
        return _run(folder, {}, bench)


def _run(root: str, options: dict[str, Any], bench: BookkeepingBench) -> int:
    started = time.perf_counter()
    _write_input(join(root, "in"), options, bench)
    print(f"wrote {bench.rows} rows in {bench.shards} shards in {time.perf_counter() - started:.1f}s")
    job = measured(run_driver, root, options, bench)
    print(
        f"driver: {job['units']} units; planning {job['plan_s']:.1f}s, {job['units']} publishes and commit records "
        f"{job['commit_s']:.1f}s ({job['commit_s'] / job['units'] * 1e3:.1f} ms each), the resume check "
        f"{job['committed_s']:.2f}s, manifest and _SUCCESS {job['finish_s']:.2f}s; peak {job['peak_mb']:.0f} MB "
        f"resident ({job['peak_mb'] - job['ready_mb']:.0f} MB above {job['ready_mb']:.0f} MB after imports)"
    )
    print(
        f"_manifest.json {job['manifest_bytes'] / 1e6:.2f} MB ({job['manifest_bytes'] / job['units']:.0f} bytes "
        f"per unit), _job.json {job['job_bytes'] / 1e3:.0f} kB, commit records {job['commits_bytes'] / 1e6:.2f} MB"
    )
    checked = measured(run_verify, root, options)
    print(
        f"verify --input: {checked['verdict']} in {checked['verify_s']:.1f}s, peak {checked['peak_mb']:.0f} MB "
        f"resident ({checked['peak_mb'] - checked['ready_mb']:.0f} MB above {checked['ready_mb']:.0f} MB after "
        "imports)"
    )
    return 0 if checked["verdict"] == "OK" else 1


def _write_input(url: str, options: dict[str, Any], bench: BookkeepingBench) -> None:
    fs, path = filesystem(url, options)
    per_shard = bench.rows // bench.shards
    for n in range(bench.shards):
        prompts = [f"def f{i}(x):" for i in range(n * per_shard, (n + 1) * per_shard)]
        buffer = io.BytesIO()
        pq.write_table(pa.table({"prompt": prompts}), buffer, row_group_size=bench.rows_per_unit)
        write_bytes(fs, join(path, f"shard-{n:05d}.parquet"), buffer.getvalue())


def run_driver(root: str, options: dict[str, Any], bench: BookkeepingBench) -> dict[str, Any]:
    """The driver's bookkeeping for the whole job, phase by phase (in a process of its own)."""
    config = load_config(
        default_job_config(),
        None,
        [
            f"input.url={join(root, 'in')}",
            f"output.url={join(root, 'out')}",
            f"input.rows_per_unit={bench.rows_per_unit}",
        ],
    )
    config.input.storage_options = config.output.storage_options = options
    output = OutputFolder(config.output.url, options)
    output.fs.ls(output.path.split("/")[0])  # an S3 client's fixed cost, paid before `ready_mb`
    ready_mb = resident_mb()
    times = [time.perf_counter()]
    shards = list_shards(config.input.url, options, exclude=config.output.url)
    units = plan_units(shards, config.input.rows_per_unit)
    ident = identity(config, shards, {"target": "simulated"})
    job_record = {"fingerprint": fingerprint(ident), "identity": ident, "config": to_plain_dict(config)}
    output.claim(job_record["fingerprint"], job_record)
    times.append(time.perf_counter())
    for unit in units:
        output.publish(_simulated_attempt(unit, output))
    times.append(time.perf_counter())
    committed = output.committed()
    times.append(time.perf_counter())
    parts = [committed[u.unit_id] for u in units]
    summary = {"rows": bench.rows, "rows_committed": sum(p["rows"] for p in parts)}
    output.finish({**job_record, "parts": parts, "total_rows": summary["rows_committed"], "summary": summary})
    times.append(time.perf_counter())
    return {
        "units": len(units),
        "plan_s": times[1] - times[0],
        "commit_s": times[2] - times[1],
        "committed_s": times[3] - times[2],
        "finish_s": times[4] - times[3],
        "manifest_bytes": output.fs.size(join(output.path, MANIFEST_FILE)),
        "job_bytes": output.fs.size(join(output.path, "_job.json")),
        "commits_bytes": sum(output.fs.du(join(output.path, "_commits"), total=False).values()),
        "ready_mb": ready_mb,
    }


def _simulated_attempt(unit: WorkUnit, output: OutputFolder) -> UnitResult:
    """What an actor stages for a unit when every row generates one token, without the model."""
    n = unit.num_rows
    columns: dict[str, list] = {name: [None] * n for name in OUTPUT_SCHEMA.names}  # strategies' columns: null
    columns |= {
        "row_id": [derived_row_id(unit.shard_name, unit.first_row + i) for i in range(n)],
        "sample_index": [0] * n,
        "completion": ["x"] * n,
        "finish_reason": ["length"] * n,
        "num_prompt_tokens": [4] * n,
        "num_generated_tokens": [1] * n,
        "strategy": ["autoregressive"] * n,
    }
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns, schema=OUTPUT_SCHEMA), buffer)
    data = buffer.getvalue()
    staged = output.staged_url(unit.unit_id)
    write_bytes(output.fs, staged.removeprefix(output.prefix), data)
    log = json.dumps({"unit_id": unit.unit_id, "batch_size": n, "generated_tokens": n}) + "\n"
    write_bytes(output.fs, output.batch_log_url(unit.unit_id, 1).removeprefix(output.prefix), log.encode())
    return UnitResult(
        unit_id=unit.unit_id,
        attempt=1,
        staged_url=staged,
        num_rows=n,
        num_errors=0,
        sha256=hashlib.sha256(data).hexdigest(),
        num_bytes=len(data),
        prompt_tokens=4 * n,
        generated_tokens=n,
        wall_s=0.0,
        actor="simulated",
        device="cpu",
    )


def run_verify(root: str, options: dict[str, Any]) -> dict[str, Any]:
    filesystem(root, options)[0].ls(root.removeprefix("s3://").split("/")[0] if root.startswith("s3://") else root)
    ready_mb = resident_mb()
    started = time.perf_counter()
    report = verify(join(root, "out"), join(root, "in"), options)
    verdict = "OK" if report.ok else "; ".join(report.problems[:3])
    return {"verify_s": time.perf_counter() - started, "verdict": verdict, "rows": report.rows, "ready_mb": ready_mb}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

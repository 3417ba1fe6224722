"""Soak (`make soak`, not in CI): seeded runs with random fault points and random bad rows.

Each run must end with `accelgen verify` passing against its input. The tally is printed.
"""

from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from jobs.shipped import default_job_config
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.verify import verify
from workers.common.contract import unit_id
from workers.common.faults import FAULTS_ENV

RUNS = int(os.environ.get("ACCELGEN_SOAK_RUNS", "20"))  # `make soak RUNS=50`
BAD_ROWS = [None, b"", b"  \n", b"\xff\xfe", b"\x00\x01"]


def _random_input(rng: random.Random, folder) -> list[str]:
    folder.mkdir()
    units = []
    for shard in range(rng.randint(1, 3)):
        n = rng.randint(0, 7)
        prompts = [rng.choice(BAD_ROWS) if rng.random() < 0.25 else f"def f{i}(x):".encode() for i in range(n)]
        pq.write_table(
            pa.table({"prompt": pa.array(prompts, pa.binary())}), folder / f"{shard}.parquet", row_group_size=2
        )
        units += [unit_id(shard, g) for g in range(0, -(-n // 2) if n else 0)]
    return units


def _random_fault(rng: random.Random, units: list[str]) -> dict:
    if not units:
        return {}
    unit = rng.choice(units)
    return rng.choice(
        [
            {},
            {"exit_at_row": {"unit": unit, "row": rng.randint(0, 1), "attempts": [1]}},
            {"exit_after_upload": {"unit": unit, "attempts": [1]}},
            {"hang_at_row": {"unit": unit, "row": 0, "attempts": [1]}},
        ]
    )


@pytest.mark.slow
def test_soak(tmp_path, tiny_model_dir, monkeypatch):
    tally = {"passed": 0, "failed": 0}
    try:
        for seed in range(RUNS):
            rng = random.Random(seed)
            units = _random_input(rng, tmp_path / f"in-{seed}")
            fault = _random_fault(rng, units)
            monkeypatch.setenv(FAULTS_ENV, json.dumps(fault))
            overrides = [
                f"input.url={tmp_path / f'in-{seed}'}",
                f"output.url={tmp_path / f'out-{seed}'}",
                f"model.target={tiny_model_dir}",
                "input.rows_per_unit=2",
                "generation.max_new_tokens=4",
                "workers.unit_timeout_s=5",
            ]
            run_job(load_config(default_job_config(), None, overrides))
            report = verify(str(tmp_path / f"out-{seed}"), str(tmp_path / f"in-{seed}"), {})
            tally["passed" if report.ok else "failed"] += 1
            print(f"soak run {seed}: fault {fault or 'none'}: {'verified' if report.ok else report.problems}")
    finally:
        ray.shutdown()
    print(f"soak tally: {tally['passed']} passed, {tally['failed']} failed")
    assert tally["failed"] == 0

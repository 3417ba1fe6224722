"""Faults survived: each injected at a chosen point; afterwards the output verifies and equals an unfaulted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from jobs.shipped import default_job_config
from pipeline.actor_pool import CRASHING_ROW
from pipeline.commit import commit_record_name
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.verify import verify
from workers.common.contract import derived_row_id, part_name, unit_id
from workers.common.faults import FAULTS_ENV

PROMPTS = [f"def f{i}(x):" + " y" * (i % 4) for i in range(12)]
CRASHING = derived_row_id("shard-1.parquet", 3)  # the row a fault plan makes crash its actor


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    ray.shutdown()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def job_input(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("faults-in")
    for n in range(3):
        table = pa.table({"prompt": PROMPTS[n * 4 : n * 4 + 4]})
        pq.write_table(table, folder / f"shard-{n}.parquet", row_group_size=2)
    return folder


def _overrides(job_input: Path, out: Path, model: Path) -> list[str]:
    return [
        f"input.url={job_input}",
        f"output.url={out}",
        f"model.target={model}",
        "model.dtype=float64",
        "input.rows_per_unit=2",
        "generation.max_new_tokens=6",
        "workers.batch_size=2",
    ]


def _run(job_input, out, model, *extra):
    return run_job(load_config(default_job_config(), None, [*_overrides(job_input, out, model), *extra]))


def _parts(out: Path) -> dict[str, str]:
    return {p["part"]: p["sha256"] for p in json.loads((out / "_manifest.json").read_text())["parts"]}


@pytest.fixture(scope="module")
def reference(job_input, tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("reference") / "out"
    assert _run(job_input, out, tiny_model_dir).status == "succeeded"
    return _parts(out)


def _check(out: Path, job_input: Path, reference: dict[str, str]) -> None:
    report = verify(str(out), str(job_input), {})
    assert report.ok, report.problems
    assert _parts(out) == reference


@pytest.mark.parametrize(
    "fault",
    [
        {"exit_at_row": {"unit": unit_id(1, 0), "row": 1, "attempts": [1]}},
        {"exit_after_upload": {"unit": unit_id(0, 1), "attempts": [1, 2]}},
    ],
    ids=["actor_killed_mid_unit", "crash_after_upload_before_commit"],
)
def test_actor_deaths_are_retried(fault, job_input, tiny_model_dir, reference, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps(fault))
    outcome = _run(job_input, tmp_path / "out", tiny_model_dir)
    assert outcome.status == "succeeded"
    _check(tmp_path / "out", job_input, reference)


def test_an_actor_killed_mid_batch_loses_and_repeats_no_row_of_the_units_in_the_batch(
    job_input, tiny_model_dir, reference, tmp_path, monkeypatch, capsys
):
    """Units of two rows, batches of six: the batch the actor dies in holds rows of several units,
    every one of which fails with it, is retried alone and committed once."""
    killer = unit_id(1, 0)
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"exit_at_row": {"unit": killer, "row": 1, "attempts": [1]}}))
    outcome = _run(job_input, tmp_path / "out", tiny_model_dir, "workers.batch_size=6")
    assert outcome.status == "succeeded"
    failed = {line.split()[1] for line in capsys.readouterr().err.splitlines() if "attempt 1 failed" in line}
    assert killer in failed and len(failed) > 1  # the batch spanned units: its neighbours fell with it
    for unit in failed:
        assert json.loads((tmp_path / "out" / commit_record_name(unit)).read_text())["attempt"] == 2
    _check(tmp_path / "out", job_input, reference)


def test_a_hung_actor_is_restarted_and_its_unit_rescheduled(
    job_input, tiny_model_dir, reference, tmp_path, monkeypatch, capsys
):
    """The first attempt hangs for two minutes: the job's own time-out (8 s without progress) must
    give it up and run a second attempt, which is the one committed."""
    hung = unit_id(2, 0)
    monkeypatch.setenv(
        FAULTS_ENV, json.dumps({"hang_at_row": {"unit": hung, "row": 0, "attempts": [1], "seconds": 120}})
    )
    # 8 s without progress: the hang's attempt is given up, never a retry's few steps on a loaded machine.
    outcome = _run(job_input, tmp_path / "out", tiny_model_dir, "workers.unit_timeout_s=8")
    assert outcome.status == "succeeded"
    assert json.loads((tmp_path / "out" / commit_record_name(hung)).read_text())["attempt"] == 2
    assert f"unit {hung} attempt 1 failed: no progress for workers.unit_timeout_s" in capsys.readouterr().err
    _check(tmp_path / "out", job_input, reference)


def test_a_row_that_always_crashes_becomes_an_error_row(job_input, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"crash_row_id": CRASHING}))
    outcome = _run(job_input, tmp_path / "out", tiny_model_dir, "workers.max_unit_attempts=2")
    assert outcome.status == "succeeded"
    assert verify(str(tmp_path / "out"), str(job_input), {}).ok
    part = pq.read_table(tmp_path / "out" / part_name(unit_id(1, 1))).to_pylist()  # rows 2 and 3 of shard 1
    crashed = next(r for r in part if r["row_id"] == CRASHING)
    assert crashed["finish_reason"] == "error" and crashed["error"] == CRASHING_ROW
    assert [r["finish_reason"] for r in part if r["row_id"] != CRASHING] == ["length"]


def _cli(job_input, out, model, env_extra=None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != FAULTS_ENV} | (env_extra or {})
    command = [sys.executable, "-m", "jobs.cli", "generate", *_overrides(job_input, out, model)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_driver_killed_mid_job_then_rerun(job_input, tiny_model_dir, reference, tmp_path):
    out = tmp_path / "out"
    killed = _cli(job_input, out, tiny_model_dir, {FAULTS_ENV: json.dumps({"driver_exit_after_commits": 2})})
    assert killed.wait(timeout=300) == 137
    assert len(list((out / "_commits").iterdir())) == 2 and not (out / "_SUCCESS").exists()
    rerun = _cli(job_input, out, tiny_model_dir)
    log, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, log
    assert "resuming job" in log
    _check(out, job_input, reference)


def test_sigterm_stops_cleanly_and_a_rerun_resumes(job_input, tiny_model_dir, reference, tmp_path):
    """SIGTERM right after the first commit (the driver sends it itself, so it lands there on any
    machine, busy or not): the job stops before the next one, and a rerun resumes."""
    out = tmp_path / "out"
    driver = _cli(job_input, out, tiny_model_dir, {FAULTS_ENV: json.dumps({"driver_sigterm_after_commits": 1})})
    log, _ = driver.communicate(timeout=300)
    assert driver.returncode == 143, log
    assert "interrupted" in log and not (out / "_SUCCESS").exists()
    committed = {json.loads(p.read_text())["part"] for p in (out / "_commits").iterdir()}
    assert len(committed) == 1 and {p.name for p in out.glob("part-*")} == committed
    rerun = _cli(job_input, out, tiny_model_dir)
    log, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, log
    _check(out, job_input, reference)

"""The default torch threads of CPU actors: the rule, on literal machines (its measurements are in
`pipeline/threads.py`)."""

from __future__ import annotations

import pytest

from pipeline.threads import LARGE_STEP_BYTES, default_torch_threads
from workers.common.model_files import local_weights_bytes


@pytest.mark.parametrize(
    ("cpus", "actors", "threads"),
    [
        (2, 1, 1),  # the 2-core machine: one core stays with the driver and Ray
        (1, 1, 1),  # nothing to spare: the actor takes the core
        (16, 1, 15),
        (16, 3, 5),  # 15 cores shared, rounded down
        (2, 4, 1),  # never fewer than one
        (2.5, 1, 1),  # fractional CPU counts (Ray's resources) round down
    ],
)
def test_one_core_is_left_to_the_driver_and_ray_and_the_rest_shared(cpus, actors, threads):
    assert default_torch_threads(cpus, actors) == threads


@pytest.mark.parametrize(
    ("cpus", "actors", "threads"),
    [
        (2, 1, 2),  # the 2-core machine: long steps leave the driver's work small beside them
        (16, 3, 5),  # 16 cores shared, rounded down
        (1, 1, 1),
    ],
)
def test_actors_whose_steps_read_much_share_every_core(cpus, actors, threads):
    """A step's weight bytes times its rows: a large target at batch 1, or a small one at a batch of 8."""
    assert default_torch_threads(cpus, actors, LARGE_STEP_BYTES) == threads
    assert default_torch_threads(cpus, actors, LARGE_STEP_BYTES // 8, batch_size=8) == threads
    assert default_torch_threads(cpus, actors, LARGE_STEP_BYTES - 1) == default_torch_threads(cpus, actors)
    small = default_torch_threads(cpus, actors, LARGE_STEP_BYTES // 8 - 1, batch_size=8)
    assert small == default_torch_threads(cpus, actors)


def test_a_local_folders_weights_are_its_safetensors_files(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "more.safetensors").write_bytes(b"x" * 20)
    (tmp_path / "config.json").write_text("{}")
    assert local_weights_bytes(str(tmp_path)) == 320
    assert local_weights_bytes(f"file://{tmp_path}") == 320
    assert local_weights_bytes("s3://bucket/model") is None  # not read: the rule without it
    assert local_weights_bytes(str(tmp_path / "empty")) is None


def test_the_job_bench_decodes_in_process_with_the_threads_of_a_jobs_actor():
    """x bench compares a job with its own code: the in-process side runs the actor's threads."""
    import os

    from jobs.bench.job import job_torch_threads
    from jobs.bench.settings import BenchConfig

    cpus, shipped = os.cpu_count() or 1, local_weights_bytes(BenchConfig().model)
    assert job_torch_threads(BenchConfig(job_overrides=["workers.torch_threads=3"]), 1) == 3
    for batch_size in (1, 16):  # the shipped target: one core left to the driver at batch 1, not at 16
        expected = default_torch_threads(cpus, 1, shipped, batch_size)
        assert job_torch_threads(BenchConfig(), batch_size) == expected
    assert default_torch_threads(cpus, 1, shipped, 1) == default_torch_threads(cpus, 1)
    assert default_torch_threads(cpus, 1, shipped, 16) == default_torch_threads(cpus, 1, LARGE_STEP_BYTES)
    two = BenchConfig(job_overrides=["workers.num_actors=2"])
    assert job_torch_threads(two, 1) == default_torch_threads(cpus, 2, shipped, 1)

"""The default torch threads of CPU actors: the rule, on literal machines (its measurements are in
`pipeline/threads.py`)."""

from __future__ import annotations

import pytest

from pipeline.threads import default_torch_threads


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


def test_the_job_bench_decodes_in_process_with_the_threads_of_a_jobs_actor():
    """x bench compares a job with its own code: the in-process side runs the actor's threads."""
    import os

    from jobs.bench.job import job_torch_threads
    from jobs.bench.settings import BenchConfig

    assert job_torch_threads(BenchConfig(job_overrides=["workers.torch_threads=3"])) == 3
    assert job_torch_threads(BenchConfig()) == default_torch_threads(os.cpu_count() or 1, 1)
    two = BenchConfig(job_overrides=["workers.num_actors=2"])
    assert job_torch_threads(two) == default_torch_threads(os.cpu_count() or 1, 2)

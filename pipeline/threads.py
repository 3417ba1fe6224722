"""How many torch threads a CPU actor runs by default (`workers.torch_threads=0`).

An actor's decode loop is not the only thing on its node: the driver polls its actors, publishes parts
and writes logs, and Ray's own processes (GCS, raylet, the object store) serve them. With as many
torch threads as cores, a decode step's threads wait on a core those take at every step, and a
thread that waits holds every other thread of the step at its next barrier. Measured on a 2-core
machine (one actor, batch 1, the shipped target, 24 held-out prompts): 2 threads decoded 134–208
tokens/s in a job against 478 in-process, 1 thread 302–349; at batch 8, 499–612 against 931.

So the threads are the cluster's cores less one for the driver and Ray, shared among the actors,
and never fewer than one. On a one-core machine nothing can be spared and the actor takes the core.

That holds where a step takes a few milliseconds, as the shipped 27 MB target's do. A target of
`LARGE_TARGET_BYTES` or more reads that much at every step, tens of milliseconds on a CPU, beside which
the driver's and Ray's work between steps is small: there the actors share every core. The 0.5B twin
(1.5 GB, bfloat16, the same 2-core machine, autoregressive jobs): batch 1, 14.1-14.3 tokens/s with one
thread against 16.8 with two; batch 16, 46.0 against 81.7 (docs/benchmarks.md).
"""

from __future__ import annotations

DRIVER_CORES = 1  # the driver's loop and Ray's own processes beside the actors
LARGE_TARGET_BYTES = 256 * 2**20  # weights on disk from which actors take every core


def default_torch_threads(cpus: float, actors: int, target_bytes: int | None = None) -> int:
    """torch threads per CPU actor when `workers.torch_threads` is 0: `cpus` (the cluster's) less
    `DRIVER_CORES` where that leaves one, or all of them for a target of `target_bytes` ≥
    `LARGE_TARGET_BYTES` (None: not known, as for a remote folder), shared among `actors`; at least one."""
    large = target_bytes is not None and target_bytes >= LARGE_TARGET_BYTES
    spare = cpus - DRIVER_CORES if cpus > DRIVER_CORES and not large else cpus
    return max(1, int(spare // max(1, actors)))

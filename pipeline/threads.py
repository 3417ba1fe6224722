"""How many torch threads a CPU actor runs by default (`workers.torch_threads=0`).

An actor's decode loop is not the only thing on its node: the driver polls its actors, publishes parts
and writes logs, and Ray's own processes (GCS, raylet, the object store) serve them. With as many
torch threads as cores, a decode step's threads wait on a core those take at every step, and a
thread that waits holds every other thread of the step at its next barrier. Measured on a 2-core
machine (one actor, batch 1, the shipped target, 24 held-out prompts): 2 threads decoded 134–208
tokens/s in a job against 478 in-process, 1 thread 302–349; at batch 8, 499–612 against 931.

So the threads are the cluster's cores less one for the driver and Ray, shared among the actors,
and never fewer than one. On a one-core machine nothing can be spared and the actor takes the core.

That held where a step takes a few milliseconds. A step reads the target's weights once and does
work in proportion to its rows: where the weights' bytes times the batch size reach `LARGE_STEP_BYTES`,
a step takes tens of milliseconds, beside which the driver's and Ray's work between steps is small, and
the actors share every core. The 0.5B twin (1.5 GB, bfloat16, autoregressive jobs): batch 1, 14.1-14.3
tokens/s with one thread against 16.8 with two; batch 16, 46.0 against 81.7. The shipped target (27 MB),
once an actor ran every torch operation on its decoding thread (`workers/engine.py`; before, two threads
lost to one in a job mostly for want of that), in alternated jobs on 24 held-out prompts: batch 8, one
thread 899-1,043 tokens/s against two 1,240-1,377 (`auto` 743-874 against 952-1,062); batch 24, 866-1,124
against 1,400-1,578; batch 1, 259-277 against 229-301, and `auto` 462-484 against 343-370: at batch 1
its steps are short and its drafters' host work, which one thread runs, is much of them.
"""

from __future__ import annotations

DRIVER_CORES = 1  # the driver's loop and Ray's own processes beside the actors
LARGE_STEP_BYTES = 128 * 2**20  # weights on disk times batch size from which actors take every core


def default_torch_threads(cpus: float, actors: int, target_bytes: int | None = None, batch_size: int = 1) -> int:
    """torch threads per CPU actor when `workers.torch_threads` is 0: `cpus` (the cluster's) less
    `DRIVER_CORES` where that leaves one, or all of them where the target's `target_bytes` (None: not
    known, as for a remote folder) times `batch_size` reach `LARGE_STEP_BYTES`, shared among `actors`;
    at least one."""
    large = target_bytes is not None and target_bytes * batch_size >= LARGE_STEP_BYTES
    spare = cpus - DRIVER_CORES if cpus > DRIVER_CORES and not large else cpus
    return max(1, int(spare // max(1, actors)))

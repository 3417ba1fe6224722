"""How many torch threads a CPU actor runs by default (`workers.torch_threads=0`).

An actor's decode loop is not the only thing on its node: the driver polls its actors, publishes parts
and writes logs, and Ray's own processes (GCS, raylet, the object store) serve them. With as many
torch threads as cores, a decode step's threads wait on a core those take at every step, and a
thread that waits holds every other thread of the step at its next barrier. Measured on a 2-core
machine (one actor, batch 1, the shipped target, 24 held-out prompts): 2 threads decoded 134–208
tokens/s in a job against 478 in-process, 1 thread 302–349; at batch 8, 499–612 against 931.

So the threads are the cluster's cores less one for the driver and Ray, shared among the actors,
and never fewer than one. On a one-core machine nothing can be spared and the actor takes the core.
"""

from __future__ import annotations

DRIVER_CORES = 1  # the driver's loop and Ray's own processes beside the actors


def default_torch_threads(cpus: float, actors: int) -> int:
    """torch threads per CPU actor when `workers.torch_threads` is 0: `cpus` (the cluster's) less
    `DRIVER_CORES` where that leaves one, shared among `actors`; at least one."""
    spare = cpus - DRIVER_CORES if cpus > DRIVER_CORES else cpus
    return max(1, int(spare // max(1, actors)))

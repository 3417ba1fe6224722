"""Ray for a job: started (or joined) once per driver, and stopped quietly.

`accelgen generate` starts Ray while the driver's own modules import (`start_while_importing`): a
cold job's first seconds are the driver importing Ray, pyarrow and its own modules (about 0.8 s on a
2-core machine; it imports no torch, which only the actors need) and Ray starting its processes
(2.5-3.5 s), which mostly wait on one another and on sockets, so the two overlap on a machine's cores
instead of adding up.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

import ray
from ray._private import ray_constants

WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by every process Ray starts (`init_ray`)
MALLOC_ARENAS_ENV = "MALLOC_ARENA_MAX"  # glibc's, read as each process Ray starts begins (`init_ray`)


def init_ray(address: str) -> None:
    """Join the cluster at `address`, or start one of the job's own (`""`); nothing if Ray is up."""
    if ray.is_initialized():
        return
    if address:
        import strategies
        import workers

        # The actors of a remote cluster get this project's code with the job (the driver's own
        # modules stay here); the cluster's image must hold the dependencies.
        runtime_env = {"py_modules": [workers, strategies]}
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
    else:
        # Ray starts its workers 15 nicer than itself, below every other process of the machine: a
        # generator actor then decodes slower whenever anything else runs (sharing a core with a nice-19
        # process, a nice-15 actor gets 70% of it, one at 0 98.5%). On a cluster of the job's own, the
        # actors run at the job's niceness (`nice accelgen generate` still lowers them all); a value the
        # environment sets is kept.
        os.environ.setdefault(WORKER_NICENESS_ENV, "0")
        # An actor decodes on a thread of its own, which glibc would give an arena of its own: the first
        # batch's prefill then took its memory fresh from the kernel, 0.4-0.5 s of system time at batch
        # 24 on a 2-core VM (a page first touched cost some 10 µs while Ray ran), where the main arena
        # already held what loading and warming up the model had freed: open 0.69-0.76 s against
        # 1.00-1.02 s with one arena per process (docs/performance.md, "Prefill in chunks").
        os.environ.setdefault(MALLOC_ARENAS_ENV, "1")
        # "local": a cluster of this process's own, never another job's or session's that happens to run
        # on the machine (a bare init would join the latest one it finds).
        ray.init(address="local", include_dashboard=False, logging_level="WARNING", log_to_driver=True)


def start_while_importing(address: str, module: str) -> None:
    """`init_ray(address)` here while `module` imports on a thread; back when both are done. An error of
    either is raised here, Ray's first (the import's is then raised again by the caller's own import)."""
    failed: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # raised again below, on the caller's thread
            failed.append(exc)

    importer = threading.Thread(target=load, name=f"import {module}", daemon=True)
    importer.start()
    try:
        init_ray(address)
    finally:
        importer.join()
    if failed:
        raise failed[0]


def stop_ray() -> None:
    """Shut Ray down with its output silenced, so that what the job printed last stays last.

    A job refused early kills actors still starting, and Ray's processes report that (a GCS line about an
    actor it could not kill) seconds later, through the driver's log forwarding, over the message the
    user must act on. Shutting down stops that forwarding; the process's stdout and stderr go to
    /dev/null meanwhile, since the forwarding threads and Ray's C++ core write to them until they stop.
    """
    if not ray.is_initialized():
        return
    _stop_the_monitor_at_once()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        ray.shutdown()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def _stop_the_monitor_at_once() -> None:
    """Make the coming `ray.shutdown()` kill the autoscaler's monitor of a cluster of this job's own
    outright: it does not exit on SIGTERM, so Ray, which stops its processes one kind at a time, each
    given a second to exit after SIGTERM before SIGKILL, waited that whole second for it (the raylet,
    the GCS, the dashboard and the log monitor each took 0.01-0.04 s) at the end of every job. Nothing
    where Ray's node does not look as expected (its private `_kill_process_type` and `all_processes`,
    Ray 2.60): Ray's shutdown is then its own."""
    node = getattr(ray._private.worker, "_global_node", None)
    stop_kind = getattr(node, "_kill_process_type", None)
    processes = getattr(node, "all_processes", None)
    if stop_kind is None or not isinstance(processes, dict):
        return

    def stop(process_type: str, *args, **kwargs) -> None:
        if process_type == ray_constants.PROCESS_TYPE_MONITOR:
            for info in processes.get(process_type, ()):
                if info.process.poll() is None:
                    info.process.kill()
        stop_kind(process_type, *args, **kwargs)

    node._kill_process_type = stop

"""The actor pool: generator actors on Ray, fed units, with scheduling, retries, heartbeats and the
search for a row that crashes its actor.

Units go to actors several at a time so that an actor's batch spans units and refills as rows
finish (`workers.engine`); staged parts are committed one at a time, and a failed attempt is
retried, alone on the same or a restarted actor, up to `workers.max_unit_attempts` times.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections import deque
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from tqdm import tqdm

from pipeline.auto_dtype import measured_choice
from pipeline.cluster import init_ray
from pipeline.commit import OutputFolder
from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.phases import Phases, actor_start_phases
from pipeline.threads import default_torch_threads
from pipeline.unit_flights import MAX_UNITS_PER_ACTOR, Flight, PoolRun
from strategies.control.controller import Learned
from workers.actor import GeneratorActor
from workers.common import faults
from workers.common.controller_stats import StatsKey
from workers.common.model_files import local_weights_bytes
from workers.common.spec import UnitInputError, UnitResult, WorkerSpec, WorkUnit

# CPUs of the cluster that no actor may reserve: Ray's own tasks need somewhere to run.
RESERVED_CPUS = 1.0
PROGRESS_POLL_S = 1.0


CRASHING_ROW = "this row made the generator process crash on every attempt; it was skipped"


class JobInterrupted(Exception):
    """The driver was asked to stop (SIGTERM): nothing partial was committed; rerun to resume."""


class _StopOnSigterm:
    """Within the block, SIGTERM sets `requested` instead of killing the driver mid-commit."""

    requested = False

    def __enter__(self) -> _StopOnSigterm:
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class ActorPool:
    """Generator actors on Ray, sized so they never starve Ray's own tasks, fed one unit at a time."""

    def __init__(self, config: JobConfig, spec: WorkerSpec, phases: Phases) -> None:
        """Start Ray and the actors, without waiting for them to load (`wait_ready`): `phases` gets Ray
        start. A cluster that cannot hold the actors fails here, before the job writes anything."""
        self.config = config
        self.job_id = spec.job_id
        init_ray(config.ray.address)
        phases.lap("ray_start")
        resources = ray.cluster_resources()
        cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
        w = config.workers
        use_gpus = gpus > 0 and w.num_gpus_per_actor > 0
        n = w.num_actors or (max(1, int(gpus // w.num_gpus_per_actor)) if use_gpus else 1)
        if n * w.num_cpus_per_actor > cpus - RESERVED_CPUS:
            raise JobError(
                f"workers.num_actors={n} × workers.num_cpus_per_actor={w.num_cpus_per_actor} reserves "
                f"{n * w.num_cpus_per_actor:g} CPUs, but the cluster has {cpus:g} and {RESERVED_CPUS:g} must stay "
                "free for Ray's own tasks: lower workers.num_cpus_per_actor (fractions such as 0.5 work) or "
                "workers.num_actors"
            )
        if not use_gpus and spec.workers.torch_threads == 0:
            threads = default_torch_threads(cpus, n, local_weights_bytes(config.model.target), w.batch_size)
            spec = dataclasses.replace(spec, workers=dataclasses.replace(spec.workers, torch_threads=threads))
        options: dict[str, Any] = {
            "num_cpus": w.num_cpus_per_actor,
            "num_gpus": w.num_gpus_per_actor if use_gpus else 0,
            "max_restarts": -1,  # unit attempts bound the restarts an actor's deaths can cause
            # run_unit of each unit in flight there (`PoolRun.actor_for`), and progress() polls beside them.
            "max_concurrency": MAX_UNITS_PER_ACTOR + 2,
            "resources": dict(w.custom_resources),
        }
        self.faults = faults.plan()
        if self.faults:
            options["runtime_env"] = {"env_vars": {faults.FAULTS_ENV: os.environ[faults.FAULTS_ENV]}}
        remote = ray.remote(GeneratorActor).options(**options)
        self.created_at = time.time()
        self.actors = [remote.remote(spec, f"actor-{i}") for i in range(n)]
        # `model.dtype=auto` on CPU: the job's dtype for every actor's `ready()`; "" until `choose_dtype`.
        self.auto_dtype = spec.auto_dtype
        self.measures_dtype = config.model.dtype == "auto" and not spec.auto_dtype and not use_gpus
        self.resources_per_actor = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]}
        self.started: list[dict[str, Any]] = []

    def wait_ready(self, job_id: str, phases: Phases) -> None:
        """Wait until every actor has loaded its models, and give them the job's id (known once the input
        is planned). `phases` gets the wait, split by the slowest actor's own account (`Generator.ready`):
        its imports, each model it loaded and the rest of its constructor, each for the part the
        job waited for (`actor_start_phases`)."""
        self.job_id, waited_from = job_id, time.time()
        self.started = self._wait_ready(self.config.workers.actor_start_timeout_s)
        phases.lap("actor_start")
        slowest = max(self.started, key=lambda info: info["init_began"] + sum(info["load_s"].values()))
        seen = actor_start_phases(self.created_at, slowest["init_began"], slowest["load_s"], waited_from, time.time())
        for name, seconds in seen.items():
            if name != "actor_start":
                phases.take("actor_start", name, seconds)

    def _ready(self, a: int) -> ray.ObjectRef:
        """Actor `a`'s `ready()`, which also names the job and its dtype to it (again, after a restart)."""
        return self.actors[a].ready.remote(self.job_id, self.auto_dtype or None)

    def choose_dtype(self) -> str:
        """`model.dtype=auto` for a new job on CPUs (`measures_dtype`): the first actor times a decode step in
        each dtype as it starts, and the choice (`pipeline.auto_dtype.measured_choice`) goes to every actor."""
        try:
            info = ray.get(
                self.actors[0].ready.remote(None, None, True), timeout=self.config.workers.actor_start_timeout_s
            )
        except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError) as exc:
            raise JobError(f"generator actor 0 failed to start: {_cause(exc)}") from None
        self.auto_dtype = measured_choice(info)
        return self.auto_dtype

    def _wait_ready(self, timeout_s: float) -> list[dict[str, Any]]:
        """Every actor's `ready()` once it has started. Ray waits forever for an actor it cannot schedule;
        the job gives up after `timeout_s`."""
        refs = {self._ready(i): i for i in range(len(self.actors))}
        done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        started: dict[int, dict[str, Any]] = {}
        for ref in done:
            try:
                info = ray.get(ref)
            except (RayActorError, RayTaskError) as exc:
                raise JobError(f"generator actor {refs[ref]} failed to start: {_cause(exc)}") from None
            mb = info["packed_bytes"] / 1e6
            packed = f", weights packed for their matmul kernels: {mb:.1f} MB more" if mb else ""
            print(
                f"actor {info['actor']} ready on {info['device']} "
                f"({info['dtype']}, {info['torch_threads']} threads{packed})"
            )
            started[refs[ref]] = info
        if pending:
            raise JobError(
                f"{len(pending)} of {len(refs)} generator actors were not running after "
                f"workers.actor_start_timeout_s={timeout_s:g}s. Each asks for {self.resources_per_actor}; "
                f"the cluster has {ray.available_resources()} free. Lower workers.num_cpus_per_actor / "
                "workers.num_gpus_per_actor / workers.num_actors, add nodes, or raise the time-out if the "
                "model takes that long to load"
            )
        return [started[i] for i in range(len(self.actors))]

    def run(
        self, units: list[WorkUnit], output: OutputFolder, total_rows: int, rows_before: int
    ) -> tuple[list[UnitResult], dict[str, str]]:
        """Feed every unit to an idle actor, commit each staged part; returns results and failed units.

        A failed attempt is retried (`_attempt_failed`); a unit whose attempts all killed their actor
        is searched for the row that does (`_find_crashing_row`), which then becomes an error row. An
        attempt that makes no progress (no batch finished) for `workers.unit_timeout_s` is taken as
        hung: its actor is restarted and the unit retried. SIGTERM stops the job between commits.
        """
        n = len(self.actors)
        run = PoolRun(queue=deque((u, 1) for u in units), committed_rows=rows_before, units_on=[0] * n, rows_on=[0] * n)
        bar = tqdm(total=total_rows, initial=rows_before, unit="row", desc="generate", dynamic_ncols=True)
        started = time.perf_counter()
        snapshot = self._progress()
        with _StopOnSigterm() as stop:
            try:
                while run.queue or run.inflight:
                    if stop.requested:
                        raise JobInterrupted("SIGTERM received: stopped between commits")
                    self._dispatch(run, output, snapshot)
                    done, _ = ray.wait(list(run.inflight), num_returns=1, timeout=PROGRESS_POLL_S)
                    for ref in done:
                        self._settle(run, run.inflight.pop(ref), ref, output)
                    snapshot = self._progress()
                    self._watch(run.inflight, snapshot, self.config.workers.unit_timeout_s)
                    _show_progress(bar, run, snapshot, time.perf_counter() - started)
            finally:
                bar.close()
        return run.results, run.failures

    def _dispatch(self, run: PoolRun, output: OutputFolder, snapshot: list[tuple[int, int]]) -> None:
        """Hand queued units to actors with room for them (`PoolRun.actor_for`), in queue order where they fit."""
        self._recovered(run.recovering)
        waiting: deque[tuple[WorkUnit, int]] = deque()
        while run.queue:
            unit, attempt = run.queue.popleft()
            rows = unit.num_rows * self.config.generation.n
            a = run.actor_for(attempt, rows, self.config.workers.batch_size)
            if a is None:
                waiting.append((unit, attempt))
                continue
            ref = self.actors[a].run_unit.remote(
                unit,
                attempt,
                output.staged_url(unit.unit_id),
                output.batch_log_url(unit.unit_id, attempt),
                run.error_rows.get(unit.unit_id, {}),
            )
            run.took_off(ref, Flight(unit, attempt, a, snapshot[a], snapshot[a], time.monotonic(), rows))
        run.queue = waiting

    def _settle(self, run: PoolRun, flight: Flight, ref: ray.ObjectRef, output: OutputFolder) -> None:
        """An attempt ended: commit what it staged, or decide what its failure means."""
        try:
            result: UnitResult = ray.get(ref)
        except (RayActorError, RayTaskError) as exc:
            self._attempt_failed(run, flight, exc)
            return
        run.landed(flight)
        output.publish(result)
        run.results.append(result)
        run.committed_rows += result.num_rows
        run.commits += 1
        faults.after_commit(self.faults, run.commits)

    def _attempt_failed(self, run: PoolRun, flight: Flight, exc: RayActorError | RayTaskError) -> None:
        """Retry the unit, look for a row that crashes the actor, or fail the unit: an input error
        fails it at once; after `workers.max_unit_attempts` attempts, a unit whose attempts killed
        their actor gets as many more, each after a search that turns the crashing row into an
        error row; any other unit fails."""
        unit, attempt, a = flight.unit, flight.attempt, flight.actor
        message = "no progress for workers.unit_timeout_s" if flight.hung else _cause(exc)
        tqdm.write(f"unit {unit.unit_id} attempt {attempt} failed: {message}", file=sys.stderr)
        run.landed(flight)
        if isinstance(exc, RayActorError):  # Ray restarts it; no work until it is back
            if a not in run.recovering:
                run.recovering[a] = self._ready(a)
            run.crashes[unit.unit_id] = run.crashes.get(unit.unit_id, 0) + (not flight.hung)
        max_attempts = self.config.workers.max_unit_attempts
        if _is_input_error(exc):
            run.failures[unit.unit_id] = message
        elif attempt < max_attempts:
            run.queue.append((unit, attempt + 1))
        elif run.crashes.get(unit.unit_id, 0) and attempt < 2 * max_attempts:
            row = self._find_crashing_row(a, unit, run.error_rows.get(unit.unit_id, {}))
            if row is None:
                run.failures[unit.unit_id] = message
            else:
                tqdm.write(f"unit {unit.unit_id}: row {row} crashes the actor", file=sys.stderr)
                run.error_rows.setdefault(unit.unit_id, {})[row] = CRASHING_ROW
                run.crashes[unit.unit_id] = 0
                run.queue.append((unit, attempt + 1))
        else:
            run.failures[unit.unit_id] = message

    def _watch(self, inflight: dict[ray.ObjectRef, Flight], snapshot: list[tuple[int, int]], timeout_s: float) -> None:
        """Heartbeats: an attempt's actor finishing batches is alive; one silent past `timeout_s` is
        restarted (the attempt then fails and is retried)."""
        now = time.monotonic()
        killed = set()
        for flight in inflight.values():
            beat = snapshot[flight.actor]
            if beat != (0, 0) and beat != flight.beat:
                flight.beat, flight.beat_at = beat, now
            elif not flight.hung and now - flight.beat_at > timeout_s:
                flight.hung = True
                if flight.actor not in killed:  # its other attempts fail with it
                    killed.add(flight.actor)
                    ray.kill(self.actors[flight.actor], no_restart=False)

    def _recovered(self, recovering: dict[int, ray.ObjectRef]) -> None:
        """Forget actors back from a restart (their ready() answered); the others are asked again."""
        for a, ref in list(recovering.items()):
            done, _ = ray.wait([ref], timeout=0)
            if not done:
                continue
            try:
                ray.get(ref)
                del recovering[a]
            except (RayActorError, RayTaskError):  # still restarting
                recovering[a] = self._ready(a)

    def _await_ready(self, a: int) -> None:
        deadline = time.monotonic() + self.config.workers.actor_start_timeout_s
        while True:
            try:
                ray.get(self._ready(a), timeout=self.config.workers.actor_start_timeout_s)
                return
            except (RayActorError, RayTaskError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(PROGRESS_POLL_S)

    def _find_crashing_row(self, a: int, unit: WorkUnit, known: dict[int, str]) -> int | None:
        """Bisect the unit's rows with probe runs until one row alone kills the actor (None if none does)."""
        rows = [i for i in range(unit.num_rows) if i not in known]
        while len(rows) > 1:
            half = rows[: len(rows) // 2]
            rows = half if self._probe_crashes(a, unit, half) else rows[len(half) :]
        return rows[0] if rows and self._probe_crashes(a, unit, rows) else None

    def _probe_crashes(self, a: int, unit: WorkUnit, rows: list[int]) -> bool:
        self._await_ready(a)
        try:
            ray.get(self.actors[a].probe_rows.remote(unit, rows), timeout=self.config.workers.unit_timeout_s)
            return False
        except RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actors[a], no_restart=False)
            return True

    def _progress(self) -> list[tuple[int, int]]:
        """(rows, tokens) done by each actor; a restarting actor reports (0, 0) this round."""
        refs = [actor.progress.remote() for actor in self.actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=PROGRESS_POLL_S)
        snapshot = []
        for ref in refs:
            try:
                snapshot.append(tuple(ray.get(ref)) if ref in done else (0, 0))
            except (RayActorError, RayTaskError):
                snapshot.append((0, 0))
        return snapshot

    def loaded_since_ready(self) -> dict[str, float]:
        """Seconds each optional model took to load on first use after the actors started (the longest
        over actors, who load in parallel); actors that no longer answer are left out."""
        refs = [self._ready(a) for a in range(len(self.actors))]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=PROGRESS_POLL_S)
        loaded: dict[str, float] = {}
        for ref, before in zip(refs, self.started, strict=True):
            if ref not in done:
                continue
            try:
                now = ray.get(ref)["load_s"]
            except (RayActorError, RayTaskError):
                continue
            for model, seconds in now.items():
                if model not in before["load_s"]:
                    loaded[model] = max(loaded.get(model, 0.0), seconds)
        return loaded

    def controller_statistics(self) -> dict[StatsKey, list[Learned]]:
        """What each actor's controller learned, by key; an actor that does not answer is left out."""
        refs = [actor.controller_statistics.remote() for actor in self.actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=10 * PROGRESS_POLL_S)  # idle actors answer at once
        learned: dict[StatsKey, list[Learned]] = {}
        for ref in done:
            try:
                found = ray.get(ref)
            except (RayActorError, RayTaskError):
                continue
            if found is not None:
                learned.setdefault(found[0], []).append(found[1])
        return learned

    def shutdown(self) -> None:
        """Kill the actors; a second call (the job's own, after the run's) finds none."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def _show_progress(bar: tqdm, run: PoolRun, snapshot: list[tuple[int, int]], elapsed_s: float) -> None:
    """Rows committed plus rows the attempts in flight have finished, and the actors' tokens/s."""
    in_flight_rows = sum(max(0, snapshot[f.actor][0] - f.start[0]) for f in run.inflight.values())
    bar.n = min(bar.total, run.committed_rows + in_flight_rows)
    bar.set_postfix(tok_s=f"{sum(g for _, g in snapshot) / elapsed_s:.1f}")
    bar.refresh()


def _cause(exc: BaseException) -> str:
    """The underlying error's message: a task's exception, or the last line of an actor's traceback."""
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return str(cause)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _is_input_error(exc: BaseException) -> bool:
    return isinstance(getattr(exc, "cause", None), UnitInputError)

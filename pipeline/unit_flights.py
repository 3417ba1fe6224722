"""Which unit attempts are in flight on which actor, and where the next one goes.

Kept apart from Ray (`pipeline/actor_pool.py` makes the calls): this is the pool's bookkeeping alone,
what each actor holds and what the run has gathered so far."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import ray

from workers.common.spec import UnitResult, WorkUnit

MAX_UNITS_PER_ACTOR = 64  # attempts in flight on one actor at most (each holds a thread there)


@dataclass
class Flight:
    """An attempt of a unit in flight on an actor, with its last heartbeat (actor progress)."""

    unit: WorkUnit
    attempt: int
    actor: int
    start: tuple[int, int]  # the actor's (rows, tokens) when the attempt began
    beat: tuple[int, int]  # ... at its last heartbeat
    beat_at: float
    rows: int  # output rows it decodes (input rows × generation.n)
    hung: bool = False


@dataclass
class PoolRun:
    """The pool's run state: its bookkeeping while it runs a job's units."""

    queue: deque[tuple[WorkUnit, int]]  # (unit, attempt) waiting for an actor
    committed_rows: int  # rows of committed units, those of earlier runs included
    units_on: list[int]  # per actor: attempts in flight there
    rows_on: list[int]  # per actor: output rows of those attempts
    alone: set[int] = field(default_factory=set)  # actors decoding a retry, which runs alone
    inflight: dict[ray.ObjectRef, Flight] = field(default_factory=dict)
    recovering: dict[int, ray.ObjectRef] = field(default_factory=dict)  # actor -> its ready() while Ray restarts it
    results: list[UnitResult] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # unit -> why it failed
    crashes: dict[str, int] = field(default_factory=dict)  # unit -> attempts that ended with the actor's death
    error_rows: dict[str, dict[int, str]] = field(default_factory=dict)  # unit -> rows not to decode, and why
    commits: int = 0  # this run's

    def actor_for(self, attempt: int, rows: int, batch_size: int) -> int | None:
        """The actor to take an attempt of `rows` output rows, or None for now.

        A first attempt goes to the actor with the fewest rows in flight while it holds fewer than two
        units or fewer than two batches' worth of rows (`workers.batch_size`): rows of the units there
        join its running batch as others finish, so a batch spans units and the next unit waits ready,
        however large units are. A retry runs alone on an actor with nothing in flight: whether the
        unit fails again is then its own doing.
        """
        ready = [a for a in range(len(self.units_on)) if a not in self.recovering and a not in self.alone]
        if attempt > 1:
            return next((a for a in ready if self.units_on[a] == 0), None)
        room = 2 * batch_size
        fits = [
            a
            for a in ready
            if self.units_on[a] < 2 or (self.units_on[a] < MAX_UNITS_PER_ACTOR and self.rows_on[a] < room)
        ]
        return min(fits, key=lambda a: self.rows_on[a], default=None)

    def took_off(self, ref: ray.ObjectRef, flight: Flight) -> None:
        """An attempt is in flight on its actor, its result to come as `ref`."""
        a = flight.actor
        self.units_on[a] += 1
        self.rows_on[a] += flight.rows
        if flight.attempt > 1:
            self.alone.add(a)
        self.inflight[ref] = flight

    def landed(self, flight: Flight) -> None:
        """An attempt is no longer in flight on its actor."""
        a = flight.actor
        self.units_on[a] -= 1
        self.rows_on[a] -= flight.rows
        if flight.attempt > 1:
            self.alone.discard(a)

"""A job's wall time as phases that add up to it.

The driver's clock runs through the job in consecutive laps (planning, Ray start, actor start,
decoding, shutdown), so their sum is the wall time by construction. Inside a lap, time measured
elsewhere is then moved out of it into phases of its own (`take`): the slowest actor's model loading
out of actor start, the first batch and the driver's commits out of decoding. What a lap keeps is
its own phase; `other` is what no lap or measurement names (the rest of an actor's constructor,
reading commit records back).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The order the summary prints them in; `load_<model>` phases go after `load_target`.
ORDER = (
    "planning",
    "ray_start",
    "actor_start",
    "load_target",
    "first_batch",
    "decoding",
    "commits",
    "shutdown",
    "other",
)


class Phases:
    """Seconds by phase, from consecutive laps of one clock (`perf_counter` unless given)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.began = self._last = clock()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """The time since the last lap (or the start) goes to phase `name`."""
        now = self._clock()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def take(self, source: str, name: str, seconds: float) -> None:
        """Move `seconds` measured inside phase `source` to phase `name`, never more than `source` holds
        nor less than nothing: the phases keep adding up to the wall time."""
        moved = min(max(seconds, 0.0), self.seconds.get(source, 0.0))
        self.seconds[source] = self.seconds.get(source, 0.0) - moved
        self.seconds[name] = self.seconds.get(name, 0.0) + moved

    @property
    def wall_s(self) -> float:
        """From the start to the last lap."""
        return self._last - self.began

    def rounded(self) -> dict[str, float]:
        """The phases in `ORDER` (loads of optional models after the target's), in seconds to the millisecond."""
        rank = {name: i for i, name in enumerate(ORDER)}
        names = sorted(self.seconds, key=lambda n: (rank.get(n, rank["load_target"] + 0.5), n))
        return {name: round(self.seconds[name], 3) for name in names}


def actor_start_phases(
    created_at: float, init_began: float, load_s: dict[str, float], visible_from: float, ready_at: float
) -> dict[str, float]:
    """The part of an actor's start-up the job waited for, by phase (all times epoch seconds).

    The actor's own account runs: process start and imports (`actor_start`, from `created_at` to its
    constructor's `init_began`), then each model it loaded (`load_<model>`, in the order given, the
    target first), then the rest of its constructor until `ready_at` (`other`). The job waited only
    from `visible_from` (actors start while the driver plans the input): each segment counts for
    the part of it after that.
    """
    phases: dict[str, float] = {}
    began = created_at
    segments = [("actor_start", init_began - created_at), *((f"load_{m}", s) for m, s in load_s.items())]
    for name, seconds in segments:
        end = began + max(seconds, 0.0)
        phases[name] = max(0.0, min(end, ready_at) - max(began, visible_from))
        began = end
    phases["other"] = max(0.0, ready_at - max(began, visible_from))
    return phases

"""A job's wall time as phases: laps of one clock, and measured time moved between them."""

from __future__ import annotations

import pytest

from pipeline.phases import Phases, actor_start_phases


def _clock(*times: float):
    ticks = iter(times)
    return lambda: next(ticks)


def test_laps_and_takes_add_up_to_the_wall_time():
    phases = Phases(_clock(100.0, 101.5, 105.0, 112.0, 112.25))
    phases.lap("planning")  # 1.5
    phases.lap("ray_start")  # 3.5
    phases.lap("actor_start")  # 7.0: 2.0 of imports, 4.0 loading the target, 1.0 the rest
    phases.take("actor_start", "other", 5.0)
    phases.take("other", "load_target", 4.0)
    phases.lap("shutdown")  # 0.25
    assert phases.wall_s == 12.25
    assert phases.seconds == pytest.approx(
        {"planning": 1.5, "ray_start": 3.5, "actor_start": 2.0, "other": 1.0, "load_target": 4.0, "shutdown": 0.25}
    )
    assert sum(phases.seconds.values()) == pytest.approx(phases.wall_s)


def test_a_take_never_moves_more_than_its_source_holds_nor_less_than_nothing():
    phases = Phases(_clock(0.0, 2.0))
    phases.lap("decoding")
    phases.take("decoding", "first_batch", 3.0)  # a clock of another machine, ahead
    phases.take("first_batch", "commits", -1.0)  # ... or behind
    assert phases.seconds == {"decoding": 0.0, "first_batch": 2.0, "commits": 0.0}


def test_rounded_lists_the_phases_in_job_order_loads_after_the_target():
    phases = Phases(_clock(0.0, 1.0, 2.0, 3.0, 4.0))
    for name in ("other", "load_draft", "load_target", "planning"):
        phases.lap(name)
    assert list(phases.rounded()) == ["planning", "load_target", "load_draft", "other"]


def test_actor_start_counts_only_what_the_job_waited_for():
    loads = {"target": 4.0, "draft": 1.0}  # imports 10..12, target 12..16, draft 16..17, the rest 17..17.5
    waited_all = actor_start_phases(10.0, 12.0, loads, visible_from=10.0, ready_at=17.5)
    assert waited_all == {"actor_start": 2.0, "load_target": 4.0, "load_draft": 1.0, "other": 0.5}
    # Planning the input took until 13.0: the imports and a second of the target's load were hidden.
    overlapped = actor_start_phases(10.0, 12.0, loads, visible_from=13.0, ready_at=17.5)
    assert overlapped == {"actor_start": 0.0, "load_target": 3.0, "load_draft": 1.0, "other": 0.5}
    # Planning outlasted the actor: nothing of its start-up was waited for.
    hidden = actor_start_phases(10.0, 12.0, loads, visible_from=20.0, ready_at=17.5)
    assert sum(hidden.values()) == 0.0

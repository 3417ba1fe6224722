"""How the controller chooses among its options (`strategies/control/controller.py`'s `_choose`) on literal
estimates, and the events it tells of each switch; each test names the mutants it kills."""

from __future__ import annotations

from literal_times import times

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A, B = "a", "b"
OPTIONS = [AUTOREGRESSIVE, A, B]


class LiteralSpeedups(AdaptiveController):
    """A controller whose speed-up estimates are a literal table: its choice is tested apart from how they
    are measured."""

    def __init__(self, speedups: dict[str, float | None]) -> None:
        super().__init__(ControllerSettings())
        self.speedups = speedups
        self.start_batch({A: DraftLimits(4, 4), B: DraftLimits(4, 4)}, 1)
        self.step = 10

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get(drafter)


def _switch(source: str, target: str, reason: str, estimates: dict[str, float | None]) -> dict:
    return {
        "scope": "batch",
        "from": source,
        "to": target,
        "reason": reason,
        "step": 10,
        "estimates": estimates,
        "batch_bucket": 4,
    }


def test_plain_steps_switch_on_to_a_drafter_that_just_ran_above_the_hysteresis():
    """Kills `_choose` turning speculation on at or below 1 + hysteresis, on a drafter that did not run the
    step just taken, to other than the best weighed estimate; its reason's wording, its event's fields
    (scope, from, to, estimates rounded to 3 places, bucket)."""
    c = LiteralSpeedups({A: 1.23456, B: 1.1})
    c.measured[A] = c.measured[B] = (100, 6400)
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (AUTOREGRESSIVE, [])  # A did not run the step just taken
    c.last_used[A] = 10
    c._choose(OPTIONS, 4)
    assert c.current == A
    assert c.drain_events() == [
        _switch(AUTOREGRESSIVE, A, "estimated speed-up 1.23 > 1.05", {AUTOREGRESSIVE: 1.0, A: 1.235, B: 1.1})
    ]


def test_plain_steps_stay_on_where_the_best_estimate_is_within_the_hysteresis_or_unknown():
    """Kills `_choose` switching on at 1 + hysteresis exactly (`>` as `>=`), taking an unknown estimate as a
    drafter's, or a zero one as other than 1 (`or 1.0`)."""
    c = LiteralSpeedups({A: 1.05, B: None})
    c.measured[A] = c.measured[B] = (100, 6400)
    c.last_used[A] = c.last_used[B] = 10
    c._choose(OPTIONS, 4)
    c.speedups = {A: 0.0, B: None}
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (AUTOREGRESSIVE, [])


def test_a_drafter_that_falls_below_the_hysteresis_gives_way_at_once():
    """Kills `_choose` keeping a drafter at or above 1 - hysteresis (`<` as `<=`), handing over to a drafter
    that did not run the step just taken instead of plain steps, or to one that did not pay; its reason's
    wording and its event's estimates (an unknown one as None)."""
    c = LiteralSpeedups({A: 0.95, B: None})
    c.measured[A] = (100, 6400)
    c.current = A
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (A, [])  # at 1 - h exactly: kept
    c.speedups[A] = 0.9
    c._choose(OPTIONS, 4)
    assert c.current == AUTOREGRESSIVE
    assert c.drain_events() == [
        _switch(A, AUTOREGRESSIVE, "estimated speed-up 0.90 < 0.95", {AUTOREGRESSIVE: 1.0, A: 0.9, B: None})
    ]


def test_a_drafter_that_falls_below_the_hysteresis_hands_over_to_a_fresh_better_one_or_to_plain_steps():
    """Kills `_choose`, below 1 - hysteresis, going to a better drafter that did not run the step just taken
    (its measurements are old: plain steps instead), not going to one that did, or staying put."""
    c = LiteralSpeedups({A: 0.5, B: 1.2})
    c.measured[A] = c.measured[B] = (100, 6400)
    c.current = A
    c._choose(OPTIONS, 4)
    assert c.current == AUTOREGRESSIVE
    assert [(e["from"], e["to"], e["reason"]) for e in c.drain_events()] == [
        (A, AUTOREGRESSIVE, "estimated speed-up 0.50 < 0.95")
    ]
    c.current = A
    c.last_used[B] = 10
    c._choose(OPTIONS, 4)
    assert c.current == B
    assert [(e["from"], e["to"], e["reason"]) for e in c.drain_events()] == [(A, B, "estimated speed-up 0.50 < 0.95")]


def test_a_drafter_that_pays_gives_way_only_to_a_fresh_one_whose_weighed_estimate_beats_it():
    """Kills `_choose` switching over on the unweighed estimate, to a drafter that did not run the step just
    taken (or then to plain steps), away from the best to itself; its reason's wording."""
    c = LiteralSpeedups({A: 1.2, B: 1.5})
    c.current = A
    c.measured[A] = (100, 6400)
    c.measured[B] = (10, 64)  # weighed 1 + 0.5 x 64 / 128 = 1.25 < 1.2 x 1.05
    c.last_used[B] = 10
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (A, [])
    c.measured[B] = (10, 192)  # weighed 1 + 0.5 x 192 / 256 = 1.375 > 1.26
    del c.last_used[B]
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (A, [])  # not fresh: A pays, so it stays
    c.last_used[B] = 10
    c._choose(OPTIONS, 4)
    assert c.current == B
    assert c.drain_events() == [_switch(A, B, "b estimated 1.50 vs 1.20", {AUTOREGRESSIVE: 1.0, A: 1.2, B: 1.5})]
    c._choose(OPTIONS, 4)  # the best is the current drafter: nothing to do
    assert (c.current, c.drain_events()) == (B, [])


def test_below_the_hysteresis_a_drafter_hands_over_only_to_one_above_it():
    """Kills `_choose`, below 1 - hysteresis, handing over to a fresh drafter at 1 + hysteresis exactly (`>` as
    `>=`) or to one above 1 - hysteresis only."""
    c = LiteralSpeedups({A: 0.5, B: 1.05})
    c.measured[A] = c.measured[B] = (100, 6400)
    c.last_used[B] = 10
    for estimate in (1.05, 1.0):
        c.current, c.speedups[B] = A, estimate
        c._choose(OPTIONS, 4)
        assert c.current == AUTOREGRESSIVE, estimate


def test_a_drafter_without_an_estimate_here_counts_as_plain_steps_beside_a_better_one():
    """Kills `_choose` taking the current drafter's unknown estimate as other than 1 (`or 1.0`)."""
    c = LiteralSpeedups({A: None, B: 1.5})
    c.measured[A] = c.measured[B] = (100, 6400)
    c.current, c.last_used[B] = A, 10
    c._choose(OPTIONS, 4)
    assert c.current == B
    assert c.drain_events() == [_switch(A, B, "b estimated 1.50 vs 1.00", {AUTOREGRESSIVE: 1.0, A: None, B: 1.5})]


def test_a_drafter_at_break_even_keeps_running_beside_an_old_better_estimate():
    """Kills `_choose`'s fresh-evidence rule turning a drafter within the hysteresis of break-even (at
    1 - hysteresis exactly, `>=` as `>`; below 1 + hysteresis) over to plain steps where a better drafter's
    estimate is old."""
    c = LiteralSpeedups({A: 0.95, B: 1.5})
    c.measured[A] = c.measured[B] = (100, 6400)
    for estimate in (0.95, 1.0):
        c.current, c.speedups[A] = A, estimate
        c._choose(OPTIONS, 4)
        assert (c.current, c.drain_events()) == (A, []), estimate


def test_a_drafter_gives_way_only_to_a_weighed_estimate_above_the_bar_not_at_it():
    """Kills `_choose` switching over where the weighed estimate equals the current one times 1 + hysteresis
    (`>` as `>=`)."""
    c = LiteralSpeedups({A: 1.0, B: 1.1})
    c.measured[A] = (100, 6400)
    c.measured[B] = (1, 64)  # weighed 1 + 0.1 x 64 / 128 = 1.05 = 1.0 x 1.05
    c.current, c.last_used[B] = A, 10
    c._choose(OPTIONS, 4)
    assert (c.current, c.drain_events()) == (A, [])


def test_a_drafter_chosen_on_a_few_row_steps_gives_way_on_both_estimates_weighed():
    """Kills `_choose` weighing only the newcomer's estimate by its evidence, not the current drafter's: one
    switched on from plain steps after two row steps (1.2 on them) would hold against a fresh drafter
    measured on eight at 2.0 (weighed 1 + 1.0 x 8 / 72 = 1.11 < 1.2 x 1.05), though its own rests on less
    (weighed 1 + 0.2 x 2 / 66 = 1.006)."""
    c = LiteralSpeedups({A: 1.2, B: 2.0})
    c.current = A
    c.measured[A] = (2, 2)
    c.measured[B] = (8, 8)
    c.last_used[B] = 10
    c._choose(OPTIONS, 4)
    assert c.current == B
    c.current, c.measured[A] = A, (100, 6400)  # weighed 1.198: it holds
    c._choose(OPTIONS, 4)
    assert c.current == A


class BucketSpeedups(AdaptiveController):
    """A controller with one drafter whose estimates are a literal table by batch bucket, plain steps
    measured at each bucket and the drafter explored: what `plan` chooses rests on the table alone."""

    def __init__(self, speedups: dict[int, float]) -> None:
        super().__init__(ControllerSettings())
        self.speedups = speedups
        self.start_batch({A: DraftLimits(4, 4)}, 8)
        self.step = 10
        for b in speedups:
            self.row_time[(AUTOREGRESSIVE, b)] = times(0.01, 0.01)
        self.measured[A] = (100, 6400)
        self.last_used[A] = 9  # it ran a step ago: no probe is due, and it is not known only from statistics

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups[b]


def test_the_choice_is_kept_per_bucket_so_a_batchs_tail_leaves_the_next_full_batch_its_drafter():
    """A drafter chosen at batch 8 that loses at batch 4 (0.9 there: a batch's tail as its rows finish) is
    turned off there, and the next batch of 8 drafts with it at once, where one choice for every bucket
    ran plain steps until its next probe (`_choose` turns a drafter on only on a step of it just taken).
    A bucket met for the first time starts from the choice left. Kills `_enter_bucket` doing nothing,
    restoring before saving, or a new bucket starting from plain steps."""
    c = BucketSpeedups({8: 1.5, 4: 0.9})
    c.current = A
    assert c.plan(8).drafter == A
    assert c.plan(4).drafter == AUTOREGRESSIVE
    assert [(e["from"], e["to"], e["batch_bucket"]) for e in c.drain_events()] == [(A, AUTOREGRESSIVE, 4)]
    c.start_batch({A: DraftLimits(4, 4)}, 8)
    assert c.plan(8).drafter == A
    assert c.plan(4).drafter == AUTOREGRESSIVE and c.drain_events() == []


def test_a_drafter_that_failed_is_not_brought_back_as_another_buckets_choice():
    """Chosen at batch 8, then failed in the batch's tail at 4: the full bucket's kept choice is plain
    steps too, and the failure is told once, not again as a best case that loses. Kills `drafter_failed`
    leaving the drafter as the choice kept at other buckets."""
    c = BucketSpeedups({8: 1.5, 4: 0.9})
    c.current = A
    assert c.plan(8).drafter == A
    c.plan(4)
    c.drain_events()
    c.drafter_failed(A, "its proposer raised")
    assert c.plan(8).drafter == AUTOREGRESSIVE
    assert [e["reason"] for e in c.drain_events()] == ["its proposer raised"]

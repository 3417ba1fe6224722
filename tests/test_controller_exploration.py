"""When the controller explores and writes off a drafter (`strategies/control/exploration.py`) on
literal estimates and times; each test names the mutants it kills."""

from __future__ import annotations

from collections import deque

import pytest
from literal_times import linear_forwards, times

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A, B = "a", "b"


class LiteralEstimates(AdaptiveController):
    """A controller whose speed-up estimates are a literal table."""

    def __init__(self, speedups: dict[str, float | None], **settings) -> None:
        super().__init__(ControllerSettings(**settings))
        self.speedups = speedups

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get(drafter)


def _started(controller: AdaptiveController, batch_size: int = 1, **limits: DraftLimits) -> AdaptiveController:
    controller.start_batch(limits, batch_size)
    return controller


def test_a_drafter_is_written_off_only_below_the_current_choice_and_before_any_step_never():
    """Kills `_written_off` counting a drafter never measured as having run a step (with `explore_steps`
    1), failing on it, writing off a raised estimate equal to the current choice's (`<` as `<=`), or
    taking a current drafter without an estimate as 2.0 rather than plain steps' 1.0."""
    once = _started(LiteralEstimates({A: 0.5}, explore_steps=1), a=DraftLimits(4, 4))
    assert not once._written_off(A, 1)  # no step yet
    c = _started(LiteralEstimates({A: 1.25, B: 1.5}), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    c.measured[A] = (2, 16)  # raised 1.25 x (1 + 0.8 / 4) = 1.5
    c.current = B
    assert not c._written_off(A, 1)  # as good as the current choice: not below it
    c.speedups[B] = None
    assert not c._written_off(A, 1)  # 1.5 beats plain steps


def test_an_exploring_step_waits_until_what_it_may_lose_fits_the_explore_budget():
    """Kills `_explore_wait` pricing the step at other than the modelled size at its bucket (the learned
    4 nodes), without the drafter's host time, a start (`_resume_cost`) subtracted, taken at another
    drafter's or bucket's, or scaled other than by a plain step times the batch, the plain steps it
    loses against or the wait's plain steps other than per row times the batch. Bucket 2, batch 2:
    forwards 0.01 (1 + 0.5 (w - 1)) s per row, host 0.005 s; at α 0.8 three tokens pay best (E/t 0.984
    against 0.976 for two, 0.96 for four): width 4, 0.03 s per row, 0.06 s a step against 0.02 plain; a
    start of half a plain step: it may lose 0.04 + 0.01 s, 1.667 s of decoding at 3%, less its own
    0.06 s: 80.3, 81 plain steps of 0.02 s."""
    c = _started(AdaptiveController(ControllerSettings()), 2, a=DraftLimits(4, 4))
    linear_forwards(c, 2, range(1, 6))
    c.alpha[(A, 2)] = 0.8
    c.host_time[(A, 2, 3)] = times(0.5)
    c.resume_setup[(A, 2)] = deque([0.5])
    assert c.draft_size(A, 2) == (3, 3)
    assert c._explore_wait(A, 2, 2) == 81
    c.decode_s = 1.61
    assert c._explore_wait(A, 2, 2) == 0


def test_an_exploring_step_beyond_a_lone_plain_forward_is_priced_as_plain_forwards_side_by_side():
    """Kills `_explore_wait`'s bound, where the model has no slope, without the drafter's host time.
    A plain forward of 0.01 s alone: the 5-wide step is five of them, 0.05 s, and its host time 0.005 s:
    it may lose 0.045 s, 1.5 s of decoding at 3%, less its own 0.055 s: 145 plain steps."""
    c = _started(AdaptiveController(ControllerSettings()), a=DraftLimits(4, 4))
    linear_forwards(c, 1, range(1, 2))
    c.host_time[(A, 1, 5)] = times(0.5)
    assert c._explore_wait(A, 1, 1) == 145


def test_a_learning_drafter_that_drafted_nothing_is_explored_at_a_plain_steps_width():
    """Kills `_explore_width` pricing a learning drafter whose steps drafted nothing (width 1) wider than 1."""
    c = _started(AdaptiveController(ControllerSettings()), trie=DraftLimits(6, 16, trees=True, learns=True))
    c.drafted_width["trie"] = times(1, 1, 1)
    assert c._explore_width("trie", 1) == 1


def test_a_drafter_never_run_is_not_explored_enough_even_where_one_row_step_would_do():
    """Kills `_measured_enough` counting a drafter never measured as one row step."""
    c = _started(AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1)), a=DraftLimits(4, 4))
    assert not c._measured_enough(A)
    c.measured[A] = (1, 1)
    assert c._measured_enough(A)


def test_a_drafter_whose_best_case_only_reaches_the_hysteresis_is_hopeless_and_said_so_once():
    """Kills `_may_pay` planning a drafter whose best case equals 1 + hysteresis (`>` as `>=`), its event's
    scope, options, reason or bucket other than these, or told twice, and its probe due at other than
    more than `max_probe_wait` steps since it ran (or since another option ran)."""
    c = _started(AdaptiveController(ControllerSettings()), a=DraftLimits(4, 4))
    c.best_cases[(A, 1)] = (0, ((), True), 1.05)  # kept: no forward timed, no host time
    assert not c._may_pay(A, 1)
    assert not c._may_pay(A, 1)
    assert c.drain_events() == [
        {
            "scope": "explore",
            "from": A,
            "to": AUTOREGRESSIVE,
            "reason": "best case 1.05 <= 1.05: rarely probed at this batch size",
            "step": 0,
            "batch_bucket": 1,
        }
    ]
    c.last_used[A], c.step = 1, 2048  # 2048 steps since it ran, counting the next: not more than max_probe_wait
    c.best_cases[(A, 1)] = (2048, ((), True), 1.05)
    assert not c._may_pay(A, 1)
    c.step = 2049
    assert c._may_pay(A, 1)


def test_an_unconfirmed_best_is_weighed_against_plain_steps_where_the_current_drafter_has_no_estimate():
    """Kills `_unconfirmed_best` taking a current drafter without an estimate as 2.0 rather than plain
    steps' 1.0, or probing an estimate that only equals 1 + hysteresis over the current choice."""
    c = _started(LiteralEstimates({A: 1.5, B: None}), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    c.current = B
    assert c._unconfirmed_best([AUTOREGRESSIVE, A, B], 1) == A
    c.current = AUTOREGRESSIVE
    c.speedups[A] = 1.05
    assert c._unconfirmed_best([AUTOREGRESSIVE, A, B], 1) is None


def test_a_drafter_that_loses_only_by_its_host_time_is_explored_in_full_first():
    """Kills `_may_pay` asking whether another drafter is explored enough, or letting a forward-only best
    case that only equals 1 + hysteresis through (`>` as `>=`). Plain forwards 0.5 s per row, hysteresis
    0.25: forwards 0.5 (1 + 0.75 (w - 1)) give a best case of 5 / 4 = 1.25 (four tokens), host time 0.25 s
    1.11; forwards 0.5 (1 + 0.5 (w - 1)) give 5 / 3, host time 0.5 s 1.25."""
    even = _started(AdaptiveController(ControllerSettings(hysteresis=0.25)), a=DraftLimits(4, 4))
    linear_forwards(even, 1, range(1, 6), plain=0.5, slope=0.75)
    even.host_time[(A, 1, 2)] = times(0.5)
    assert not even._may_pay(A, 1)
    host_bound = _started(AdaptiveController(ControllerSettings(hysteresis=0.25)), a=DraftLimits(4, 4))
    linear_forwards(host_bound, 1, range(1, 6), plain=0.5, slope=0.5)
    host_bound.host_time[(A, 1, 2)] = times(1.0)
    assert host_bound._may_pay(A, 1)  # not explored yet
    host_bound.measured[A] = (2, 8)
    assert not host_bound._may_pay(A, 1)


def test_a_probe_of_an_option_never_timed_waits_probe_every_steps():
    """Kills `probe_wait` going on to weigh an option whose cost ratio is unknown (`or` as `and`)."""
    c = _started(LiteralEstimates({A: 0.5}), a=DraftLimits(4, 4))
    assert c.probe_wait(A, 1) == 24


def test_a_trial_needs_a_raised_estimate_above_the_bar_and_a_weighed_one_at_most_at_it():
    """Kills `_on_trial` trying a drafter whose raised estimate only equals the bar (`>` as `>=`), or not
    one whose weighed estimate equals it (`>=` as `>`). Spread 1.0 over 4 row steps raises 1.25 to
    1.875, the bar of 1.5 x 1.25; over 64 row steps with 64 of evidence, 3.0 weighs 2.0, the bar of 1.0 x 2."""
    c = _started(LiteralEstimates({}, probe_spread=1.0, hysteresis=0.25), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    c.current = B
    c.measured[A] = (2, 4)
    assert not c._on_trial(A, 1.25, 1.5)
    even = _started(LiteralEstimates({}, hysteresis=1.0), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    even.current = B
    even.measured[A] = (8, 64)
    assert even._on_trial(A, 3.0, 1.0)


def test_a_drafter_is_written_off_below_one_explored_in_full():
    """Kills `_written_off` leaving out drafters explored in full from what a drafter's raised estimate must
    reach, counting one whose exploration has not ended, or one that failed: a drafter plainly behind one
    already explored would take all its `explore_rows` row steps, each a step the other could have run."""
    c = _started(LiteralEstimates({A: 1.25, B: 2.0}), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    c.measured[A] = (2, 16)  # raised 1.25 x (1 + 0.8 / 4) = 1.5
    c.measured[B] = (1, 1)
    assert not c._written_off(A, 1)  # B has not ended its exploration: plain steps are the bar
    c.measured[B] = (2, 16)
    assert c._written_off(A, 1)
    c.failed.add(B)
    assert not c._written_off(A, 1)


def test_a_drafter_not_yet_run_is_worth_its_cards_tau_over_its_modelled_step():
    """Kills `_card_speedup` ignoring the card's τ, pricing the step at other than its planned width (1 + 4
    nodes) by the cost model, or weighing it against other than the forward at width 1. Forwards of 0.01
    (1 + 0.5 (w - 1)) s per row: 5 wide, 0.03 s; a card's τ of 4.5 gives 4.5 x 0.01 / 0.03 = 1.5. None
    without a card's τ, or where plain steps have not run."""
    c = _started(AdaptiveController(ControllerSettings()), a=DraftLimits(4, 4, card_tau=4.5), b=DraftLimits(4, 4))
    assert c._card_speedup(A, 1) is None  # plain steps not run yet
    linear_forwards(c, 1, range(1, 6))
    assert c._card_speedup(A, 1) == pytest.approx(1.5)
    assert c._card_speedup(B, 1) is None


def test_an_exploring_step_of_a_drafter_that_has_run_may_lose_what_its_estimate_says():
    """Kills `_explore_wait` pricing a drafter whose exploration has begun at a token a row (as one not yet
    run) rather than at its estimate, or at its estimate before it has run. Forwards of 0.01 (1 + 0.5 (w -
    1)) s per row: a 5-wide step 0.03 s. Not yet run, it may lose 0.02 s: 0.667 s of decoding at 3%, less
    its own 0.03 s, 64 plain steps; at an estimate of 0.5, half its step: 47; at 2.0, nothing: now."""
    c = _started(LiteralEstimates({A: 0.5}), a=DraftLimits(4, 4))
    linear_forwards(c, 1, range(1, 6))
    assert c._explore_wait(A, 1, 1) == 64
    c.measured[A] = (1, 1)
    assert c._explore_wait(A, 1, 1) == 47
    c.speedups[A] = 2.0
    assert c._explore_wait(A, 1, 1) == 0

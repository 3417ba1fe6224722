"""A drafter's modelled step costs (`strategies/control/step_costs.py`) on literal times; each test names
the mutants it kills."""

from __future__ import annotations

import pytest
from literal_times import linear_forwards, times

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A, B = "a", "b"


def _controller(**limits: DraftLimits) -> AdaptiveController:
    c = AdaptiveController(ControllerSettings())
    c.start_batch(limits, 1)
    return c


def test_each_drafters_step_costs_carry_its_own_host_time_and_are_kept_per_drafter():
    """Kills `_step_costs` keeping its costs under another key than the drafter's (a second drafter gets
    the first one's), and `_modelled_step_costs` pricing a step without the drafter's host time. Forwards
    0.01, 0.015, 0.02 s per row at widths 1..3; A's host time half a plain step at width 2, flat."""
    c = _controller(a=DraftLimits(3, 3), b=DraftLimits(3, 3))
    linear_forwards(c, 1, range(1, 4))
    c.host_time[(A, 1, 2)] = times(0.5)
    assert c._step_costs(A, 1) == pytest.approx([2.0, 2.5, 2.5])
    assert c._step_costs(B, 1) == pytest.approx([1.5, 2.0, 2.0])


def test_step_costs_at_a_bucket_with_only_the_plain_forward_are_the_two_token_forward_at_every_depth():
    """Kills `_modelled_step_costs` pricing depths at width 3 where only width 1 was timed (the nearest
    bucket's slope would make the deeper drafts dearer than the first), and dividing by a plain step
    that has not run at the bucket (a forward timed there alone is no plain step: no costs)."""
    c = _controller(a=DraftLimits(3, 3))
    linear_forwards(c, 1, range(1, 4))  # slope 0.005 s per row per width at bucket 1
    linear_forwards(c, 2, range(1, 2), plain=0.02)
    assert c._modelled_step_costs(A, 2) == pytest.approx([1.25, 1.25, 1.25])  # 0.025 / 0.02
    unplanned = _controller(a=DraftLimits(3, 3))
    unplanned.forward.observe(1, 1, 0.01)
    assert unplanned._modelled_step_costs(A, 1) is None


def test_a_priced_step_carries_the_drafters_host_time_and_an_unmodelled_step_costs_nothing():
    """Kills `_priced_row_s` pricing the step without the drafter's host time, and `_step_cost` other than
    0 where the model does not cover the bucket. Forward 0.015 s per row at width 2, host 0.005 s."""
    c = _controller(a=DraftLimits(3, 3))
    assert c._step_cost(A, 1) == 0.0
    linear_forwards(c, 1, range(1, 4))
    c.host_time[(A, 1, 2)] = times(0.5)
    assert c._priced_row_s(A, 1, 2) == pytest.approx(0.02)


def test_a_best_case_peaks_where_the_host_time_turns_dear_and_is_kept_per_drafter():
    """Kills `_best_case` leaving the host time's measured widths out of the depths it weighs (or taking
    another drafter's, their costs for widths, or only the widths both have), pricing the forward alone
    one token wider, and `best_case` keeping its value under another key than the drafter's. Forwards
    0.5 (1 + 0.25 (w - 1)) s per row, widths 1 and 2 timed; A's host time is none up to width 4, then 1 s
    per width more: four tokens for 0.875 s, 2.29 plain steps' worth, where its forward widths alone
    weigh one token (1.6) and six (3.5 / 4.25). Without host time six tokens cost 1.25 s: 2.8."""
    c = _controller(a=DraftLimits(6, 6), b=DraftLimits(6, 6))
    linear_forwards(c, 1, range(1, 3), plain=0.5, slope=0.25)
    for width, plain_steps in ((2, 0.0), (4, 0.0), (6, 4.0)):
        c.host_time[(A, 1, width)] = times(plain_steps)
    assert c.best_case(A, 1) == pytest.approx(4 / 1.75)
    assert c.best_case(B, 1) == pytest.approx(2.8)
    assert c._best_case(A, 1, with_host=False) == pytest.approx(2.8)


def test_a_host_time_is_borrowed_from_the_nearest_bucket_where_the_drafter_ran_the_larger_of_two():
    """Kills `_host_curve` taking the smallest bucket measured, or the smaller of two as near. A's host time
    is a tenth of a plain step at bucket 2 (0.02 s), and at bucket 8 (0.04 s)."""
    c = _controller(a=DraftLimits(3, 3))
    for b, plain in ((2, 0.2), (8, 0.4)):
        c.row_time[(AUTOREGRESSIVE, b)] = times(plain)
        c.host_time[(A, b, 2)] = times(0.1)
    assert [c._host_curve(A, b)[1][0] for b in (1, 2, 4, 8, 16)] == pytest.approx([0.02, 0.02, 0.04, 0.04, 0.04])

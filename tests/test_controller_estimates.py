"""A drafter's τ at a batch bucket and node budget, its cost ratio, and its speed-up estimate from them
(`strategies/control/estimates.py`), on literal averages and times; each test names the mutants it kills."""

from __future__ import annotations

from collections import deque

import pytest

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.cost_model import FORWARD_SAMPLES, RecentTime
from strategies.control.state import Ema
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A = "a"


class PlannedBudgets(AdaptiveController):
    """A controller whose drafts are planned at a literal node budget per batch bucket: what is read at the
    budget planned there is tested apart from how it is sized."""

    def __init__(self, budgets: dict[int, int], **settings) -> None:
        super().__init__(ControllerSettings(**settings))
        self.budgets = budgets
        self.start_batch({A: DraftLimits(4, 4)}, 1)

    def draft_size(self, drafter: str, b: int | None = None) -> tuple[int, int]:
        return self.depth[drafter], self.budgets[b]


def _with_tau(tau_at: dict[tuple[int, int], Ema]) -> PlannedBudgets:
    c = PlannedBudgets({1: 4, 2: 4, 8: 4}, smoothing_rows=32)
    c.tau[A] = Ema(2.0, 10.0)
    c.tau_at[A] = tau_at
    return c


def _times(value: float) -> RecentTime:
    return RecentTime(9, recent=deque([value]), count=1)


def test_tau_at_a_bucket_and_budget_is_shrunk_toward_the_buckets_and_that_toward_the_drafters():
    """Kills `_tau` other than: the bucket's mean over its budgets weighed by what each has seen, shrunk
    toward the overall τ by `evidence_rows` against seen x `smoothing_rows`, then the budget planned at the
    bucket (`draft_size`'s nodes there) shrunk alike toward that; the bucket's own entries only."""
    c = _with_tau({(1, 4): Ema(3.0, 1.0), (1, 2): Ema(1.0, 3.0), (8, 8): Ema(5.0, 0.5)})
    # bucket 1: mean (3 x 1 + 1 x 3) / 4 = 1.5, toward 2.0: (1.5 x 4 x 32 + 2 x 64) / (4 x 32 + 64) = 5 / 3;
    # budget 4: (3 x 1 x 32 + 5 / 3 x 64) / (32 + 64) = 19 / 9
    assert c._tau(A, 1) == pytest.approx(19 / 9)
    assert c._tau(A, 8) == pytest.approx((5.0 * 0.5 * 32 + 2.0 * 64) / (0.5 * 32 + 64))  # no τ at budget 4 there
    assert c._tau(A, 2) == pytest.approx(2.0)  # nothing at bucket 2: the overall τ
    c.memo.clear()
    c.budgets[1] = 2
    assert c._tau(A, 1) == pytest.approx((1.0 * 3 * 32 + 5 / 3 * 64) / (3 * 32 + 64))


def test_tau_is_kept_until_the_next_measurement():
    """Kills `_tau` computing again on every call instead of keeping its value in `memo` under its own key."""
    c = _with_tau({(1, 4): Ema(3.0, 1.0), (1, 2): Ema(1.0, 3.0)})
    assert c._tau(A, 1) == pytest.approx(19 / 9)
    c.tau_at[A][(1, 4)] = Ema(9.0, 1.0)
    assert c._tau(A, 1) == pytest.approx(19 / 9)
    assert c.memo == {("tau", A, 1): pytest.approx(19 / 9)}


def test_tau_at_one_bucket_and_budget_or_none_is_the_drafters_and_none_before_it_drafted():
    """Kills `_tau` shrinking where the drafter has τ at one bucket and budget only (`< 2` as `<= 2` too, on
    two), failing where it has none by bucket, or answering a τ for a drafter that has not drafted."""
    assert _with_tau({(1, 4): Ema(3.0, 1.0)})._tau(A, 1) == 2.0
    assert _with_tau({(1, 4): Ema(3.0, 1.0), (2, 4): Ema(1.0, 1.0)})._tau(A, 1) == pytest.approx(
        (3.0 * 32 + (3.0 * 32 + 2.0 * 64) / 96 * 64) / 96
    )
    c = _with_tau({})
    del c.tau_at[A]
    assert c._tau(A, 1) == 2.0
    del c.tau[A]
    assert c._tau(A, 1) is None


def test_a_speedup_is_tau_at_its_bucket_over_the_cost_ratio_and_unknown_without_either():
    """Kills `speedup` other than τ at its bucket over the cost ratio, other than 1 for plain steps, or
    answering without a τ or a cost ratio."""
    c = _with_tau({(1, 4): Ema(3.0, 1.0), (1, 2): Ema(1.0, 3.0)})
    assert c.speedup(A, 1) is None  # no step times yet
    c.row_time[(AUTOREGRESSIVE, 1)] = _times(0.01)
    c.row_time[(A, 1)] = _times(1.6)
    c.memo.clear()
    assert c.speedup(A, 1) == pytest.approx(19 / 9 / 1.6)
    assert c.speedup(AUTOREGRESSIVE, 1) == 1.0
    del c.tau[A]
    assert c.speedup(A, 1) is None


def test_at_a_new_bucket_where_plain_steps_ran_the_cost_ratio_is_the_modelled_steps():
    """Kills `cost_ratio` modelling a bucket where the drafter's ratio was measured, where plain steps did not
    run, where the drafter's host time is unknown, or where no forward was timed (or borrowing the nearest
    bucket's ratio where it should model); the modelled ratio other than the priced step as wide as the
    budget planned at the bucket, over the plain forward; the ratio not kept in `memo` until the next
    measurement."""
    c = PlannedBudgets({1: 4, 4: 3, 8: 4})
    for width in range(1, 6):  # 0.01 s a row, 0.005 more per token of width
        for _ in range(FORWARD_SAMPLES):
            c.forward.observe(4, width, 0.01 * (1 + 0.5 * (width - 1)))
    c.row_time[(AUTOREGRESSIVE, 1)] = _times(0.02)
    c.row_time[(A, 1)] = _times(1.8)
    assert c.cost_ratio(A, 4) == 1.8  # no plain steps at 4 yet
    c.row_time[(AUTOREGRESSIVE, 4)] = _times(0.01)
    c.memo.clear()
    assert c.cost_ratio(A, 4) == 1.8  # the drafter's host time unknown
    c.host_time[(A, 1, 5)] = _times(0.2)  # 0.2 x 0.02 s = 0.004 s a row, at bucket 1
    assert c.cost_ratio(A, 4) == 1.8  # kept until the next measurement
    c.memo.clear()
    assert c.cost_ratio(A, 4) == pytest.approx((0.025 + 0.004) / 0.01)  # forward 1 + 3 wide plus host time
    assert c.cost_ratio(A, 1) == 1.8
    assert c.cost_ratio(A, 8) == 1.8  # no forward timed at 8
    c.row_time[(A, 4)] = _times(2.5)
    c.memo.clear()
    assert c.cost_ratio(A, 4) == 2.5
    assert c.memo[("ratio", A, 4)] == 2.5


def test_a_learning_drafter_that_never_ran_rests_on_no_row_steps():
    """Kills `_evidence` of a learning drafter without a record or measurements counting other than 0 row
    steps (a default of one, or none to index)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4, learns=True)}, 1)
    c.row_steps = 512
    assert c._evidence(A) == 0.0
    assert c._weighed(A, 3.0) == 1.0


def test_a_measured_cost_ratio_is_kept_until_the_next_measurement():
    """Kills `cost_ratio` looking for its kept value under another key, so computing it again on every call."""
    c = PlannedBudgets({1: 4})
    c.row_time[(AUTOREGRESSIVE, 1)] = _times(0.02)
    c.row_time[(A, 1)] = _times(1.8)
    assert c.cost_ratio(A, 1) == 1.8
    c.row_time[(A, 1)] = _times(2.2)
    assert c.cost_ratio(A, 1) == 1.8
    c.memo.clear()
    assert c.cost_ratio(A, 1) == 2.2


def test_no_cost_ratio_is_modelled_over_a_plain_forward_timed_at_nothing():
    """Kills `cost_ratio` dividing by a modelled plain forward of 0 seconds (its guard `plain and step is not
    None` dropped, or `and` as `or`) instead of leaving the ratio unknown."""
    c = PlannedBudgets({4: 4})
    for _ in range(FORWARD_SAMPLES):
        c.forward.observe(4, 1, 0.0)
    c.row_time[(AUTOREGRESSIVE, 4)] = _times(0.01)
    c.row_time[(AUTOREGRESSIVE, 1)] = _times(0.02)
    c.host_time[(A, 1, 5)] = _times(0.2)
    assert c.cost_ratio(A, 4) is None

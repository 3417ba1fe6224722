"""The cost model's edges (`strategies/control/cost_model.py`): ties, a bucket with one width, budgets
without evidence, on literal timings; each test names the mutants it kills."""

from __future__ import annotations

import pytest

from strategies.control.cost_model import (
    FORWARD_SAMPLES,
    ForwardCosts,
    RecentTime,
    best_chain_depth,
    best_tree_budget,
    host_cost,
    interpolate,
    median_of_sorted,
    monotone_fit,
    segment_ends,
    tree_tau_by_budget,
)


def _timed(costs: ForwardCosts, b: int, seconds_by_width: dict[int, float]) -> None:
    """Forwards at bucket `b`, per row, each width timed enough to enter the fit."""
    for width, seconds in seconds_by_width.items():
        for _ in range(FORWARD_SAMPLES):
            costs.observe(b, width, seconds)


def test_a_bucket_with_one_width_extrapolates_along_the_nearest_slope_the_larger_bucket_of_two_as_near():
    """Kills `extrapolates` asking for two widths at the bucket and a slope elsewhere, `_slope_near`
    taking buckets from the widths' places in the keys, or the smaller of two buckets as near."""
    costs = ForwardCosts()
    _timed(costs, 2, {1: 0.01, 3: 0.02})  # 0.005 s per width
    _timed(costs, 8, {1: 0.01, 3: 0.03})  # 0.01 s per width
    _timed(costs, 4, {1: 0.01})
    assert costs.extrapolates(4)
    assert costs.row_seconds(4, 3) == pytest.approx(0.03)  # bucket 8's slope, not bucket 2's
    alone = ForwardCosts()
    _timed(alone, 4, {1: 0.01})
    assert not alone.extrapolates(4)


def test_a_per_depth_drafters_host_time_below_its_narrowest_width_is_in_proportion_to_the_depth():
    """Kills `host_cost` dividing by the depth instead of multiplying, or not scaling a first width of 2
    (a step of width 1 drafts nothing: no drafter's time)."""
    measured = monotone_fit({4: (0.6, 5)})  # 3 draft tokens: 0.6
    assert host_cost(measured, 3, per_depth=True) == pytest.approx(0.4)
    assert host_cost(monotone_fit({2: (0.3, 5)}), 1, per_depth=True) == 0.0


def test_of_two_budgets_as_fast_the_smaller_is_asked_for():
    """Kills `best_tree_budget` taking the larger of two budgets with equal tokens per second."""
    assert best_tree_budget({8: 2.0, 4: 1.5}, {8: 2.0, 4: 1.5}) == 4


def test_budgets_without_row_steps_are_a_plain_steps_tau_and_equal_evidence_mixes_half_and_half():
    """Kills `tree_tau_by_budget` keeping a budget's own τ over no row steps (or other than 1.0 there),
    dividing by no evidence at all, and mixing only where a budget's own row steps differ from the
    other's weight. 8 nodes: 2.0 over 64 row steps says 1 + 1.0 x 1.5 / 2 = 1.75 of 4 nodes; 4 nodes:
    1.5 over 64 says 1 + 0.5 x 3 / 2 = 1.75 of 8."""
    assert tree_tau_by_budget({8: (2.0, 0)}, [8, 4], 64)[8] == 1.0
    tau = tree_tau_by_budget({8: (2.0, 64), 4: (1.5, 64)}, [8, 4], 64)
    assert tau == {8: pytest.approx((2.0 + 1.75) / 2), 4: pytest.approx((1.5 + 1.75) / 2)}


def test_segment_ends_hold_every_measured_depth_within_the_drafts_reach_and_none_beyond():
    """Kills `segment_ends` leaving out a width of `max_depth` (depth max_depth - 1), or taking a width two
    beyond `max_depth` (a depth no draft reaches)."""
    assert segment_ends([1, 4], 4) == [1, 3, 4]
    assert segment_ends([1, 6], 4) == [1, 4]


def test_a_width_between_the_first_two_measured_is_interpolated_on_their_segment():
    """Kills `interpolate` skipping the first segment (widths 1 to 3) for the next one."""
    assert interpolate([1, 3, 5], [1.0, 3.0, 3.0], 2, None) == 2.0


def test_a_chains_second_token_counts_alpha_squared():
    """Kills `best_chain_depth` counting the tokens of k drafted as 1 + 1 + α + … + α^(k-1). At α 0.5 two
    tokens yield 1.75 against one token's 1.5: worth a step 1.1 times as dear, not 1.2 times (where the
    mutant's 2.5 against 2 would be)."""
    assert best_chain_depth(0.5, [1.0, 1.1]) == 2
    assert best_chain_depth(0.5, [1.0, 1.2]) == 1


def test_the_two_narrowest_widths_out_of_order_pool_too():
    """Kills `monotone_fit` pooling only from a third width on."""
    assert monotone_fit({1: (2.0, 1), 2: (1.0, 1)}) == ([1, 2], [1.5, 1.5])


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    """Kills `median_of_sorted` taking the upper middle of an even count (or testing evenness other than
    by `% 2`)."""
    assert median_of_sorted([1.0, 2.0, 4.0, 8.0]) == 3.0
    assert median_of_sorted([1.0, 2.0, 4.0]) == 2.0


def test_recent_times_count_every_measurement_and_keep_the_last_window():
    """Kills `RecentTime.update` counting a measurement other than once."""
    times = RecentTime(2)
    for x in (1.0, 2.0, 4.0):
        times.update(x)
    assert (list(times.recent), times.count) == ([2.0, 4.0], 3)

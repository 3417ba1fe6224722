"""The controller's cost model on literal timings: forwards by batch and width, and the draft sizes
that maximise tokens per second, against hand computations."""

from __future__ import annotations

import pytest

from strategies.control.cost_model import (
    FORWARD_SAMPLES,
    ForwardCosts,
    best_case_speedup,
    best_chain_depth,
    best_tree_budget,
    host_cost,
    monotone_fit,
    segment_ends,
    tree_tau_by_budget,
)

# Forward time (ms) of the shipped family's target over a ~200-token cache, 2 cores, float32, for
# 1, 2, 4, 8 and 16 new tokens per row (issue 26): nearly flat at batch 1, rising at batch 8.
WIDTHS = (1, 2, 4, 8, 16)
BATCH_1_MS = (3.1, 3.5, 2.8, 3.0, 4.0)
BATCH_8_MS = (4.0, 5.1, 6.8, 9.7, 13.9)


def _issue_costs() -> ForwardCosts:
    costs = ForwardCosts()
    for b, times in ((1, BATCH_1_MS), (8, BATCH_8_MS)):
        for width, ms in zip(WIDTHS, times, strict=True):
            for _ in range(FORWARD_SAMPLES):  # a width enters the fit from its FORWARD_SAMPLES-th sample
                costs.observe(b, width, ms / 1000 / b)  # per row
    return costs


def test_a_forward_costs_a_non_decreasing_fit_of_what_was_measured_interpolated_between_widths():
    costs = _issue_costs()
    # Batch 1: 2.8 ms at 4 tokens after 3.5 at 2 is noise; a forward over more tokens costs no less, so
    # widths 2, 4 and 8, as many samples each, pool into their mean: (3.5 + 2.8 + 3.0) / 3 = 3.1.
    assert [costs.row_seconds(1, w) * 1000 for w in (1, 2, 4, 8, 12, 16)] == pytest.approx(
        [3.1, 3.1, 3.1, 3.1, 3.55, 4]
    )
    # Batch 8, per row: between 4 and 8 tokens a quarter of the way from 6.8 to 9.7 ms per batch.
    assert costs.row_seconds(8, 5) * 8000 == pytest.approx(6.8 + (9.7 - 6.8) / 4)
    # Beyond 16 tokens, the last segment's slope goes on.
    assert costs.row_seconds(8, 20) * 8000 == pytest.approx(13.9 + (13.9 - 9.7) / 8 * 4)
    assert costs.row_seconds(4, 1) is None and not costs.covers(4)


def test_a_width_enters_the_fit_from_its_third_sample_and_one_dear_sample_moves_it_little():
    """A plain forward of 2 ms; 5 and 8 tokens measured nine times each at 3.0 and 3.4 ms. Six tokens
    run once at 5.0 ms (a pass's first deep draft) are not yet in the fit: interpolated, 3.133 ms. Two
    more at 3.2 ms make it 3.2 (the median), where the mean (3.8) over a running maximum priced every
    forward from 6 tokens up at 3.8. Three more at 3.8 ms, out of order with 8 tokens' 3.4, pool with
    them by their samples: (6 × 3.8 + 9 × 3.4) / 15 = 3.56."""
    costs = ForwardCosts()
    for _ in range(9):
        costs.observe(1, 1, 0.002)
        costs.observe(1, 5, 0.003)
        costs.observe(1, 8, 0.0034)
    costs.observe(1, 6, 0.005)
    assert costs.row_seconds(1, 6) * 1000 == pytest.approx(3.0 + 0.4 / 3)
    for _ in range(2):
        costs.observe(1, 6, 0.0032)
    assert [costs.row_seconds(1, w) * 1000 for w in (5, 6, 7, 8)] == pytest.approx([3.0, 3.2, 3.3, 3.4])
    for _ in range(3):
        costs.observe(1, 6, 0.0038)
    assert [costs.row_seconds(1, w) * 1000 for w in (5, 6, 7, 8)] == pytest.approx([3.0, 3.56, 3.56, 3.56])


def test_widths_out_of_order_pool_into_their_mean_weighted_by_their_samples():
    # 3.0 at width 2 (1 sample) above 2.0 at width 3 (3 samples): both (3.0 + 3 × 2.0) / 4 = 2.25; then
    # 2.0 at width 4 below that pool pulls it in too: (3.0 + 6.0 + 2 × 2.0) / 6 = 2.1667.
    assert monotone_fit({1: (1.0, 9), 2: (3.0, 1), 3: (2.0, 3)}) == ([1, 2, 3], [1.0, 2.25, 2.25])
    widths, costs = monotone_fit({1: (1.0, 9), 2: (3.0, 1), 3: (2.0, 3), 4: (2.0, 2), 8: (5.0, 1)})
    assert widths == [1, 2, 3, 4, 8] and costs == pytest.approx([1.0, 13 / 6, 13 / 6, 13 / 6, 5.0])
    assert monotone_fit({}) == ([], [])


def test_a_bucket_with_one_width_extends_with_the_nearest_buckets_slope_per_width():
    costs = _issue_costs()
    costs.observe(16, 1, 0.0005)
    slope_8 = (13.9 - 9.7) / 8 / 8 / 1000  # seconds per row per width: batch 8's widest segment
    assert costs.row_seconds(16, 3) == pytest.approx(0.0005 + 2 * slope_8)
    alone = ForwardCosts()
    alone.observe(2, 1, 0.002)
    assert alone.row_seconds(2, 9) == 0.002  # nothing known anywhere: flat, the optimistic side


def test_chain_length_maximises_tokens_per_second_as_a_hand_computation_does():
    """α 0.6, so E(k) = 1.6, 1.96, 2.176, 2.306, … for k = 1, 2, 3, 4, …; the step drafting k tokens
    costs the forward at width 1 + k.

    Batch 8 (ms): k=1 at width 2: 5.1; k=2 at width 3: 5.95; k=3: 6.8; k=4: 7.525 (a quarter of the
    way to 9.7). E/t = 0.314, 0.329, 0.320, 0.306: k = 2.
    Batch 1: 3.1 ms from width 1 to 8 (the fit), 3.2125 at width 9. E/t rises up to k = 7
    (2.458 / 3.1 = 0.793) and falls at k = 8 (2.475 / 3.2125 = 0.770): k = 7."""
    costs = _issue_costs()
    for b, best in ((8, 2), (1, 7)):
        step_costs = [costs.row_seconds(b, 1 + k) for k in range(1, 9)]
        assert best_chain_depth(0.6, step_costs) == best


def test_a_tree_budget_is_sized_on_what_the_budgets_tried_say_of_it():
    # τ 2.0 over 100 row steps at 8 nodes says 1 + 1.0 x (1 + 4/8) / 2 = 1.75 of 4 nodes, the middle of
    # the floor (the line from (0, 1): 1.5) and the ceiling (2.0) that concavity puts around it.
    assert tree_tau_by_budget({8: (2.0, 100)}, [8, 4], 64) == {8: 2.0, 4: 1.75}
    costs = _issue_costs()
    tau = tree_tau_by_budget({8: (2.0, 100)}, [8, 4], 64)
    # Batch 8: 4 nodes (width 5) cost 7.525 ms, 8 nodes (width 9) 10.225: 1.75/7.525 = 0.233 > 2.0/10.225 = 0.196.
    assert best_tree_budget(tau, {n: costs.row_seconds(8, 1 + n) for n in (4, 8)}) == 4
    # Batch 1: both widths cost 3.1 ms: the larger budget.
    assert best_tree_budget(tau, {n: costs.row_seconds(1, 1 + n) for n in (4, 8)}) == 8


def test_a_budget_measured_on_a_few_cold_steps_leans_on_what_a_well_measured_one_says_of_it():
    # 8 nodes: τ 1.0 over 2 row steps (a cold trie); 4 nodes: 2.5 over 2,000. 4 says 1 + 1.5 x 1.5 = 3.25
    # of 8, weighed as 64 row steps: (2 x 1.0 + 64 x 3.25) / 66. 8 says 1.0 of 4, weighed as its 2 row steps.
    tau = tree_tau_by_budget({8: (1.0, 2), 4: (2.5, 2000)}, [8, 4], 64)
    assert tau[8] == pytest.approx((2 + 64 * 3.25) / 66)
    assert tau[4] == pytest.approx((2.5 * 2000 + 1.0 * 2) / 2002)
    # Taken alone, as a lower bound, the cold 1.0 ruled 8 nodes out wherever 4 cost less: at batch 1,
    # 2.8 ms against 2.6, 8 nodes are asked for again.
    assert best_tree_budget(tau, {8: 2.8, 4: 2.6}) == 8
    # Measured over as many row steps as 4, at 2.6, 8 nodes lose on their own measurement.
    assert best_tree_budget(tree_tau_by_budget({8: (2.6, 2000), 4: (2.5, 2000)}, [8, 4], 64), {8: 2.8, 4: 2.6}) == 4


def test_best_case_is_every_draft_token_accepted_at_the_cheapest_width():
    # Compute-bound: each token of a row costs the same, so drafting k tokens yields 1 + k tokens in
    # 1 + k times the time, and any host time makes it lose.
    assert best_case_speedup(range(1, 9), 1.0, lambda k: 1.0 + k) == 1.0
    assert best_case_speedup(range(1, 9), 1.0, lambda k: 1.0 + k + 0.1) < 1
    # Latency-bound: a draft of 4 tokens for 10% more than a plain step.
    assert best_case_speedup(range(1, 5), 1.0, lambda k: 1.0 + 0.025 * k) == pytest.approx(5 / 1.1)


def test_the_best_case_over_segment_ends_is_the_best_case_over_every_depth():
    costs = _issue_costs()
    for b in (1, 8):
        widths = costs.widths(b)
        assert segment_ends(widths, 10) == [1, 3, 7, 10]  # widths 2, 4, 8 within reach; 16 beyond
        plain = costs.row_seconds(b, 1)
        for host in (0.0, 0.0002, 0.002):

            def step(k: int, b: int = b, host: float = host) -> float:
                return costs.row_seconds(b, 1 + k) + host

            everywhere = best_case_speedup(range(1, 11), plain, step)
            assert best_case_speedup(segment_ends(widths, 10), plain, step) == pytest.approx(everywhere)


def test_wide_forwards_follow_the_plain_forward_as_the_machine_speeds_up_or_slows_down():
    """A wide forward is kept as a ratio to the plain forward when it ran: measured while the machine was
    three times slower, it is not set against plain forwards measured since it is quiet."""
    costs = ForwardCosts()
    for _ in range(9):
        costs.observe(1, 1, 0.003)  # loaded: 3 ms a plain forward
    for _ in range(FORWARD_SAMPLES):
        costs.observe(1, 5, 0.0045)  # a 5-wide forward then: 1.5 plain forwards
    for _ in range(9):
        costs.observe(1, 1, 0.001)  # quiet again
    assert costs.row_seconds(1, 5) == pytest.approx(0.0015)
    costs.observe(2, 5, 0.004)  # before any plain forward at its bucket: nothing to relate it to
    assert not costs.covers(2)


def test_a_drafters_host_time_by_width_is_interpolated_and_shrinks_with_depth_only_for_per_depth_drafters():
    measured = monotone_fit({6: (0.9, 5), 4: (0.7, 5)})  # (plain steps, samples): 5 tokens 0.9, 3 tokens 0.7
    assert host_cost(measured, 5, per_depth=False) == pytest.approx(0.8)
    assert host_cost(measured, 8, per_depth=False) == pytest.approx(1.1)  # the last segment's slope goes on
    assert host_cost(measured, 2, per_depth=False) == pytest.approx(0.7)  # a lookup's search: no cheaper
    assert host_cost(measured, 2, per_depth=True) == pytest.approx(0.7 / 3)  # a draft model's: per token
    assert host_cost(monotone_fit({6: (0.9, 5)}), 9, per_depth=True) == pytest.approx(0.9)  # one width: flat above it

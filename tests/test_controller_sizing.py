"""The controller's draft sizes and step costs (`strategies/control/{sizing,step_costs,cost_model}.py`) on
literal times; each test names the mutants it kills."""

from __future__ import annotations

import pytest
from literal_times import linear_forwards, one_drafter, times

from strategies.control.state import Ema
from strategies.control.step_costs import BEST_CASE_STEPS
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord

A = "a"


def test_drafted_rows_are_tallied_until_resize_rows_then_handed_over_whole():
    """Kills `_tally_drafts` counting rows that drafted nothing, a rejection where all was accepted, a
    tally handed over before `resize_rows` row steps (`<` as `<=`), or not started afresh after."""
    c = one_drafter(DraftLimits(4, 4), resize_rows=3)
    assert c._tally_drafts(StepRecord(A, 3, 0.01, [4, 0, 2], [1, 0, 2]), 4) is None
    assert c.resize_tally[(A, 4)] == [2, 6, 3, 1]
    assert c._tally_drafts(StepRecord(A, 1, 0.01, [3], [3]), 4) == (3, 9, 6, 1)
    assert c.resize_tally[(A, 4)] == [0, 0, 0, 0]
    assert c._tally_drafts(StepRecord(A, 3, 0.01, [1, 1, 1], [0, 0, 1]), 4) == (3, 3, 1, 2)


def test_a_trees_budget_doubles_while_a_node_yields_twice_its_cost_and_halves_below_its_cost():
    """Kills `_resize` of a tree: a node's cost other than (ratio - 1) / nodes (0 when unknown), doubling
    at other than twice it (`>=`), halving at other than below it, past `max_nodes` or below
    `min_tree_nodes`."""
    c = one_drafter(DraftLimits(4, 16, trees=True))
    c.nodes[A] = 8  # a step costs 1.8 plain steps: 0.1 a node
    for yield_per_node, nodes in ((0.2, 16), (0.19, 8), (0.1, 8), (0.09, 4)):
        c.nodes[A] = 8
        c._resize(A, 1, (10, 100, round(100 * yield_per_node), 10), 1.8)
        assert c.nodes[A] == nodes, yield_per_node
    c.nodes[A] = 16
    c._resize(A, 1, (10, 100, 90, 10), 1.8)
    assert c.nodes[A] == 16
    c.nodes[A] = 4
    c._resize(A, 1, (10, 100, 0, 10), 1.8)
    assert c.nodes[A] == 4
    c.nodes[A] = 2
    c._resize(A, 1, (10, 100, 1, 10), None)  # a node's cost unknown: nothing to lose, it doubles
    assert c.nodes[A] == 4


def test_a_drafter_that_sizes_its_own_drafts_is_sized_at_its_usual_length():
    """Kills `_resize` of a drafter sizing its own drafts other than its mean draft rounded, within
    1..max_depth."""
    c = one_drafter(DraftLimits(6, 6, sizes_own=True))
    for drafted, depth in ((10, 2), (14, 4), (30, 6), (1, 1)):
        c._resize(A, 1, (4, drafted, 0, 4), 1.5)
        assert (c.depth[A], c.nodes[A]) == (depth, depth), drafted


def test_a_chain_moves_one_token_toward_its_best_length():
    """Kills `_resize` of a chain: α other than accepted / (accepted + rejections), not kept at its bucket,
    the costs without a model other than 1 + node cost x k, a move other than one token toward the best,
    the nodes not following the depth."""
    c = one_drafter(DraftLimits(4, 4, start_depth=2))
    c._resize(A, 1, (10, 20, 10, 5), None)  # α = 10 / 15; free tokens: the longest, one step up
    assert (c.alpha[(A, 1)], c.depth[A], c.nodes[A]) == (pytest.approx(2 / 3), 3, 3)
    c._resize(A, 1, (10, 30, 10, 10), 4.0)  # α = 0.5; a token costs 1: costs 2, 3, 4, 5, best 1
    assert (c.alpha[(A, 1)], c.depth[A], c.nodes[A]) == (0.5, 2, 2)
    c._resize(A, 1, (10, 30, 10, 10), 3.0)  # costs 2, 3, 4, 5 again: at 2, one more step down
    assert c.depth[A] == 1
    c._resize(A, 1, (10, 30, 10, 10), 3.0)
    assert c.depth[A] == 1


def test_a_chains_alpha_is_taken_at_the_nearest_bucket_measured_the_larger_of_two():
    """Kills `_alpha` other than the nearest measured bucket by bit length, the smaller of two as near,
    another drafter's, or something where none was measured."""
    c = one_drafter(DraftLimits(4, 4))
    assert c._alpha(A, 4) is None
    c.alpha.update({(A, 2): 0.2, (A, 8): 0.8, ("other", 4): 0.5})
    assert [c._alpha(A, b) for b in (1, 2, 4, 8, 16)] == [0.2, 0.2, 0.8, 0.8, 0.8]


def test_what_a_tree_budgets_tau_rests_on_halves_every_half_life_of_other_budgets_row_steps():
    """Kills `_tree_evidence` other than seen x 0.5 ** (row steps since / tree_half_life_rows)."""
    c = one_drafter(DraftLimits(4, 16, trees=True))
    c.measured[A] = (30, 1024)
    c.tree_tau_at[(A, 8)] = 512
    assert c._tree_evidence(A, 8, Ema(1.5, 4.0)) == pytest.approx(2.0)
    assert c._tree_evidence(A, 16, Ema(1.5, 4.0)) == pytest.approx(1.0)  # last moved at 0


def test_a_chain_is_sized_by_the_cost_model_where_it_covers_the_bucket():
    """Kills `draft_size` sizing by the model where it does not cover the bucket (or not where it does),
    `_modelled_size` pricing depth k at other than the forward 1 + k wide, or sizing a drafter that
    sizes its own drafts or has no α. Costs 1.5, 2, 2.5, 3 plain steps for k = 1..4 at α 0.8: tokens
    1.8, 2.44, 2.952, 3.3616, per cost 1.2, 1.22, 1.18, 1.12: k = 2."""
    c = one_drafter(DraftLimits(4, 4))
    assert c.draft_size(A, 1) == (4, 4)  # no model: the learned size
    linear_forwards(c, 1, range(1, 6))
    assert c.draft_size(A, 1) == (4, 4)  # no α yet
    c.alpha[(A, 1)] = 0.8
    c.memo.clear()
    assert c.draft_size(A, 1) == (2, 2)
    assert c.draft_size(A, 2) == (4, 4)  # the model does not cover bucket 2
    assert c.draft_size(A) == (4, 4)
    own = one_drafter(DraftLimits(4, 4, sizes_own=True))
    linear_forwards(own, 1, range(1, 6))
    own.alpha[(A, 1)] = 0.8
    assert own.draft_size(A, 1) == (4, 4)


def test_a_modelled_step_is_the_forward_plus_the_drafters_host_time_priced_dear_beyond_the_widest():
    """Kills `_plain_row_s` without plain steps run at the bucket, `_step_row_s` without the host time,
    `_priced_row_s` adding its margin within the widths timed, or not beyond them where the model has a
    slope, `_host_curve` other than the nearest bucket's host times in seconds (ratios times that
    bucket's plain step), `_step_cost` other than the step one token wide."""
    c = one_drafter(DraftLimits(4, 4))
    c.forward.observe(1, 1, 0.01)
    assert c._plain_row_s(1) is None  # plain steps have not run at 1
    linear_forwards(c, 1, range(1, 4))  # widths 1..3: 0.01, 0.015, 0.02
    assert c._plain_row_s(1) == pytest.approx(0.01)
    assert c._step_row_s(A, 1, 3) == pytest.approx(0.02)
    assert c._step_cost(A, 1) == pytest.approx(0.015)
    assert c._priced_row_s(A, 1, 3) == pytest.approx(0.02)
    assert c._priced_row_s(A, 1, 5) == pytest.approx(0.03 * 1.1)  # extrapolated: 10% dearer
    c.row_time[(AUTOREGRESSIVE, 2)] = times(0.02)
    c.host_time[(A, 2, 2)] = times(0.25)  # a quarter of a plain step at bucket 2: 0.005 s
    c.host_time[(A, 2, 4)] = times(0.5)
    c.host_time[("other", 1, 2)] = times(10.0)
    c.memo.clear()
    assert c._host_curve(A, 1) == ([2, 4], [pytest.approx(0.005), pytest.approx(0.01)])
    assert c._host_row_s(A, 1, 3) == pytest.approx(0.0075)
    assert c._step_row_s(A, 1, 3) == pytest.approx(0.0275)
    assert c._step_cost(A, 1) == pytest.approx(0.02)
    assert c._step_row_s(A, 2, 3) is None  # no forward timed at 2
    assert one_drafter(DraftLimits(4, 4))._host_curve(A, 1) is None


def test_a_drafters_step_costs_are_flat_beyond_the_widest_forward_timed():
    """Kills `_modelled_step_costs` pricing depths beyond the widest forward timed at a wider width, or at
    less than width 2, dividing by other than the modelled plain step, or costing where plain steps have
    not run."""
    c = one_drafter(DraftLimits(4, 4))
    linear_forwards(c, 1, range(1, 4))
    assert c._modelled_step_costs(A, 1) == pytest.approx([1.5, 2.0, 2.0, 2.0])
    plain_only = one_drafter(DraftLimits(3, 3))
    linear_forwards(plain_only, 1, range(1, 2))
    assert plain_only._modelled_step_costs(A, 1) == pytest.approx([1.0, 1.0, 1.0])
    assert one_drafter(DraftLimits(3, 3))._modelled_step_costs(A, 1) is None


def test_a_best_case_is_kept_best_case_steps_unless_what_it_rests_on_changes_in_kind():
    """Kills `_kept` keeping a value past `BEST_CASE_STEPS` steps (`<` as `<=`), across a change of the
    widths timed or of whether the host time is known, or keeping None."""
    c = one_drafter(DraftLimits(4, 4))
    calls = []

    def compute():
        calls.append(c.step)
        return float(len(calls))

    assert c._kept({}, A, 1, lambda: None) is None
    cache: dict = {}
    assert c._kept(cache, A, 1, compute) == 1.0
    c.step = BEST_CASE_STEPS - 1
    assert c._kept(cache, A, 1, compute) == 1.0
    c.step = BEST_CASE_STEPS
    assert c._kept(cache, A, 1, compute) == 2.0
    linear_forwards(c, 1, range(1, 3))
    assert c._kept(cache, A, 1, compute) == 3.0  # a width timed
    assert c._kept(cache, A, 1, compute) == 3.0
    c.row_time[(AUTOREGRESSIVE, 1)] = times(0.01)
    c.host_time[(A, 1, 2)] = times(0.1)
    c.memo.clear()
    assert c._kept(cache, A, 1, compute) == 4.0  # the host time known

"""The controller's draft sizes at their edges (`strategies/control/sizing.py`): what a tree budget's τ rests
on, what a budget or a chain's depth is costed at, a size kept for the step; each test names the mutants
it kills."""

from __future__ import annotations

import pytest
from literal_times import one_drafter, times

from strategies.control.controller import AdaptiveController
from strategies.control.cost_model import FORWARD_SAMPLES
from strategies.control.state import Ema
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord

A = "a"


def _forwards(c: AdaptiveController, b: int, seconds_by_width: dict[int, float]) -> None:
    """Forwards at bucket `b` costing `seconds_by_width` per row, each timed enough to count, and plain steps
    run there at the width-1 forward's time."""
    c.row_time[(AUTOREGRESSIVE, b)] = times(seconds_by_width[1])
    for width, seconds in seconds_by_width.items():
        for _ in range(FORWARD_SAMPLES):
            c.forward.observe(b, width, seconds)


def test_a_modelled_size_is_kept_for_the_step_until_the_memo_is_cleared():
    """Kills `draft_size` asking its memo under another key than the one it keeps the size under ("size"
    as "XXsizeXX" or "SIZE"): the size would be modelled again on every call. Costs 1.5, 2, 2.5, 3 plain
    steps for k = 1..4: at α 0.8 k = 2, at α 0.95 (tokens 1.95, 2.85, 3.71, 4.52) k = 4."""
    c = one_drafter(DraftLimits(4, 4))
    _forwards(c, 1, {w: 0.01 * (1 + 0.5 * (w - 1)) for w in range(1, 6)})
    c.alpha[(A, 1)] = 0.8
    assert c.draft_size(A, 1) == (2, 2)
    c.alpha[(A, 1)] = 0.95
    assert c.draft_size(A, 1) == (2, 2)  # the same step: the size kept
    c.memo.clear()
    assert c.draft_size(A, 1) == (4, 4)


def test_a_tree_budgets_row_steps_are_its_evidence_times_smoothing_rows_decayed_since_its_own_last_step():
    """Kills `_modelled_size` weighing a budget's τ by its evidence divided by `smoothing_rows` (`*` as `/`),
    or decaying it since the budget None was measured (at row step 0) rather than since its own last step.
    Budget 8: τ 3.0 seen 4 times (256 row steps); budget 16: τ 2.0 seen a quarter (16 row steps), both
    last measured now (row step 1024). What 8 says of 16 is 1 + 2 x (1 + 2) / 2 = 4, weighed as at most
    `evidence_rows` (64) row steps: τ(16) = (2 x 16 + 4 x 64) / 80 = 3.6, τ(8) = 2.93. A step 16 wide costs
    1.28 plain steps and one 8 wide 1: 2.81 against 2.93 tokens a plain step, so 8. Row steps of 4 / 64 and
    0.25 / 64, or decayed by 1024 / 512 half-lives to 64 and 4, leave 8's word on 16 uncapped: τ(16) 3.88,
    3.03 a plain step, so 16."""
    c = one_drafter(DraftLimits(4, 16, trees=True), min_tree_nodes=8)
    c.tree_tau[A] = {16: Ema(2.0, 0.25), 8: Ema(3.0, 4.0)}
    c.measured[A] = (30, 1024)
    c.tree_tau_at.update({(A, 16): 1024, (A, 8): 1024})
    _forwards(c, 1, {1: 0.01, 9: 0.01, 17: 0.0128})
    assert c.draft_size(A, 1) == (4, 8)


def test_a_tree_budget_n_is_costed_at_the_forward_1_plus_n_wide_and_the_drafters_own_host_time():
    """Kills `_modelled_size` costing budget n at the forward 2 + n wide, or with the host time of no drafter
    (None). τ 3.0 at budget 16, 2.5 at 8, each on many row steps. The forward costs a plain step up to 9
    wide and two from 10: 8 (3.0 / 2 against 2.5 / 1 plain steps); 2 + n wide both cost two, so 16. With
    a flat forward and the drafter's host time a plain step more at width 17 than at 9: 8 again; without
    it, 16."""
    tau = {16: Ema(3.0, 100.0), 8: Ema(2.5, 100.0)}
    stepped = one_drafter(DraftLimits(4, 16, trees=True), min_tree_nodes=8)
    stepped.tree_tau[A] = dict(tau)
    _forwards(stepped, 1, {1: 0.01, 9: 0.01, 10: 0.02, 17: 0.02, 18: 0.02})
    assert stepped.draft_size(A, 1) == (4, 8)
    hosted = one_drafter(DraftLimits(4, 16, trees=True), min_tree_nodes=8)
    hosted.tree_tau[A] = dict(tau)
    _forwards(hosted, 1, {1: 0.01, 17: 0.01})
    hosted.host_time[(A, 1, 9)] = times(0.0)
    hosted.host_time[(A, 1, 17)] = times(1.0)
    assert hosted.draft_size(A, 1) == (4, 8)


def test_a_tree_budgets_evidence_is_whole_before_the_drafter_was_measured():
    """Kills `_tree_evidence` without a default for a drafter not yet measured (None, or none given: a
    TypeError), or one of row step 1 (`(0, 1)`): nothing ran since, so all it has seen counts."""
    c = one_drafter(DraftLimits(4, 16, trees=True))
    assert c._tree_evidence(A, 8, Ema(1.5, 4.0)) == 4.0


def test_a_step_whose_rows_drafted_and_accepted_disagree_in_length_is_refused():
    """Kills `_tally_drafts` zipping a step's drafted and accepted counts without `strict` (False, None or
    left out): a row's counts would be dropped unseen."""
    c = one_drafter(DraftLimits(4, 4))
    with pytest.raises(ValueError):
        c._tally_drafts(StepRecord(A, 2, 0.01, [2, 1], [1]), 1)


def test_a_halved_tree_budget_of_odd_nodes_is_a_whole_number_of_nodes():
    """Kills `_resize` halving a tree's budget as a float (`//` as `/`): 9 nodes halve to 4, not 4.5."""
    c = one_drafter(DraftLimits(4, 9, trees=True), min_tree_nodes=2)
    c._resize(A, 1, (10, 100, 0, 10), 1.8)  # nothing accepted: below a node's cost
    assert c.nodes[A] == 4


def test_a_chains_resize_costs_depth_k_by_the_model_at_width_1_plus_k_with_its_own_host_time():
    """Kills `_resize` of a chain asking the model's costs of no drafter (None: without its host time), of
    no bucket (None: the model's costs unknown, all alike), or at width 1 - k or 2 + k. α 0.5 (tokens 1.5,
    1.75, 1.875, 1.94 for k = 1..4) from depth 2. The forward costs a plain step up to 3 wide, then a
    plain step more a token: k = 2 is best and the chain stays; at 2 + k, k = 1 (down); at 1 - k or all
    alike, k = 4 (up). With a flat forward and a host time a plain step more a token from width 2, k = 1
    (down); without it, up."""
    tally = (10, 30, 10, 10)
    stepped = one_drafter(DraftLimits(4, 4, start_depth=2))
    _forwards(stepped, 1, {1: 0.01, 2: 0.01, 3: 0.01, 4: 0.02, 5: 0.03})
    stepped._resize(A, 1, tally, None)
    assert (stepped.alpha[(A, 1)], stepped.depth[A]) == (0.5, 2)
    hosted = one_drafter(DraftLimits(4, 4, start_depth=2))
    _forwards(hosted, 1, {1: 0.01, 5: 0.01})
    hosted.host_time[(A, 1, 2)] = times(0.0)
    hosted.host_time[(A, 1, 5)] = times(3.0)
    hosted._resize(A, 1, tally, None)
    assert hosted.depth[A] == 1

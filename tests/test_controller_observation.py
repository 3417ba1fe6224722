"""What a controller learns and hands on (`strategies/control/observation.py`) on literal records; each
test names the mutants it kills."""

from __future__ import annotations

import pytest

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.settings import Learned
from strategies.control.state import Ema
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord

A, B = "a", "b"


def test_exploring_seconds_are_drained_rounded_to_the_microsecond():
    """Kills `drain_exploring` rounding any of its three sums to other than 6 decimals."""
    c = AdaptiveController(ControllerSettings())
    c.exploring_s, c.exploring_lost_s, c.decode_s = 0.12345678, 0.02345678, 0.52345678
    assert c.drain_exploring() == {"exploring_s": 0.123457, "exploring_lost_s": 0.023457, "decoding_s": 0.523457}


def test_what_a_controller_learned_holds_its_tree_sizes_forwards_and_host_times():
    """Kills `learned` leaving out the node budgets, the forward times or the host times (a round trip
    through `warm_start` loses a field on both sides alike)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 8, trees=True)}, 1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.01, [0], [0], forward_s=0.008))
    c.observe(StepRecord(A, 1, 0.02, [8], [3], width=5, forward_s=0.012))
    learned = c.learned()
    assert learned.nodes == {A: 8}
    assert learned.forward_time == {(1, 1): ([0.008], 1), (1, 5): ([1.5], 1)}
    assert list(learned.host_time) == [(A, 1, 5)]
    assert learned.host_time[(A, 1, 5)][0] == [0.8]  # (0.02 - 0.012) s over a 0.01 s plain step
    assert learned.host_time[(A, 1, 5)][1] == 1


def test_loaded_tree_budgets_count_as_measured_at_their_drafters_loaded_row_steps():
    """Kills `warm_start` dating a loaded tree budget's τ at other than its drafter's loaded row steps,
    or failing (or dating it at other than 0) for a drafter whose steps were not loaded."""
    c = AdaptiveController(ControllerSettings())
    c.warm_start(Learned(measured={A: (3, 100)}, tree_tau={(A, 8): (2.0, 1.5), (B, 4): (1.5, 0.5)}))
    assert c.tree_tau_at == {(A, 8): 100, (B, 4): 0}


def test_a_learning_drafters_tau_counts_for_what_its_idle_time_left_of_it():
    """Kills `_observe_gain` not ageing a learning drafter's overall τ, or setting what its τ rests on to
    the ageing factor instead of multiplying by it. Idle for one half-life: 2.0 measurements count as 1.0,
    then the step adds its 1 / 64."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({B: DraftLimits(4, 4, learns=True)}, 1)
    c.tau[B], c.tau_at[B] = Ema(2.0, 2.0), {(1, 4): Ema(2.0, 2.0)}
    c.evidence[B], c.row_steps = (10.0, 0), 512
    c.observe(StepRecord(B, 1, 0.01, [4], [1]))
    assert c.tau[B].seen == pytest.approx(1 + 1 / 64)
    assert c.tau_at[B][(1, 4)].seen == pytest.approx(1 + 1 / 64)


def test_tau_by_bucket_and_size_moves_by_the_steps_weight_and_share():
    """Kills `_observe_gain` counting a step of more than `smoothing_rows` rows as more than one full
    share, or updating τ by bucket and size with its share as the weight, or with a full share for a step
    of fewer rows. Two steps of 64 rows: the second, gain 4 after 2, weighs max(0.3, 1 / 2); one of 128
    rows counts once."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4)}, 128)
    c.observe(StepRecord(A, 128, 0.5, [2] * 128, [1] * 128))
    assert (c.tau[A].seen, c.tau_at[A][(128, 4)].seen) == (1.0, 1.0)
    steps = AdaptiveController(ControllerSettings())
    steps.start_batch({A: DraftLimits(4, 4)}, 64)
    steps.observe(StepRecord(A, 64, 0.5, [2] * 64, [1] * 64))
    steps.observe(StepRecord(A, 64, 0.5, [4] * 64, [3] * 64))
    assert steps.tau_at[A][(64, 4)].value == pytest.approx(3.0)
    one_row = AdaptiveController(ControllerSettings())
    one_row.start_batch({A: DraftLimits(4, 4)}, 1)
    one_row.observe(StepRecord(A, 1, 0.01, [4], [1]))
    assert one_row.tau_at[A][(1, 4)].seen == pytest.approx(1 / 64)


def test_a_step_of_a_drafter_outside_the_batchs_limits_keeps_tau_at_its_widest_draft():
    """Kills `_observe_gain` failing on a drafter neither planned nor sized in this batch (no node budget
    to key its τ by but its widest draft, no limits to say whether it drafts trees)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({}, 2)
    c.observe(StepRecord(A, 2, 0.02, [3, 5], [1, 1]))
    assert list(c.tau_at[A]) == [(2, 5)]
    assert c.tree_tau == {}


def test_a_tree_budgets_tau_is_kept_at_the_budget_planned_and_aged_from_when_it_last_moved():
    """Kills `_observe_gain` keeping a tree's τ at its widest draft rather than the planned budget, or
    ageing a budget's τ from the job's start rather than from when that budget last moved (here: no row
    steps since, so 4.0 measurements stay 4.0, then the step adds its 1 / 64)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 8, trees=True)}, 1)
    c.planned_nodes[A], c.measured[A] = 8, (10, 1023)
    c.tree_tau[A] = {8: Ema(2.0, 4.0)}
    c.tree_tau_at[(A, 8)] = 1024
    c.observe(StepRecord(A, 1, 0.01, [5], [1]))
    assert list(c.tree_tau[A]) == [8]
    assert c.tree_tau[A][8].seen == pytest.approx(4 + 1 / 64)


def test_a_row_that_cools_down_is_told_in_an_event():
    """Kills `_observe_rows`' event naming another drafter or option than the step's drafter and plain
    steps, or without its reason."""
    c = AdaptiveController(ControllerSettings(row_patience=1))
    c.start_batch({A: DraftLimits(4, 4)}, 2)
    c.observe(StepRecord(A, 2, 0.02, [4, 4], [0, 2]))
    assert c.drain_events() == [
        {"scope": "row", "from": A, "to": AUTOREGRESSIVE, "reason": "1 drafts rejected", "step": 1, "row": 0}
    ]


def test_a_drafters_starts_are_kept_over_the_time_window_and_an_exploring_step_before_plain_ones_lost_it_all():
    """Kills `_observe_times` keeping every start of a resumed drafter rather than the last `time_window`,
    and an exploring step before any plain step at its bucket losing other than its whole time (or
    failing)."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4)}, 1)
    c.exploring = A
    c.observe(StepRecord(A, 1, 0.05, [2], [0], setup_s=0.01))
    assert c.exploring_lost_s == pytest.approx(0.06)
    for i in range(10):
        c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.01, [0], [0]))
        c.observe(StepRecord(A, 1, 0.02, [2], [1], setup_s=0.001 * i))
    assert list(c.resume_setup[(A, 1)]) == pytest.approx([0.1 * i for i in range(1, 10)])

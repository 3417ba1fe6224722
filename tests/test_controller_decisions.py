"""The controller's decisions (`strategies/control/{controller,exploration,estimates,observation}.py`) on
literal statistics; each test names the mutants it kills."""

from __future__ import annotations

import math
from collections import deque

import pytest

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.cost_model import RecentTime
from strategies.control.observation import _slower_half_gain
from strategies.control.state import RowDrafting
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord

A, B = "a", "b"


class LiteralEstimates(AdaptiveController):
    """A controller whose speed-up and cost-ratio estimates are literal tables: the decisions built on
    them are tested apart from how they are measured."""

    def __init__(self, speedups: dict[str, float | None], ratios: dict[str, float | None], **settings) -> None:
        super().__init__(ControllerSettings(**settings))
        self.speedups, self.ratios = speedups, ratios

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get(drafter)

    def cost_ratio(self, option: str, b: int) -> float | None:
        return 1.0 if option == AUTOREGRESSIVE else self.ratios.get(option)


def _started(controller: AdaptiveController, drafters: dict[str, DraftLimits], batch_size: int = 1):
    controller.start_batch(drafters, batch_size)
    return controller


def test_a_steps_gain_is_the_mean_of_its_slower_half_of_rows():
    """Kills `_slower_half_gain` counting accepted tokens without the row's own (`a + 1`), the faster
    half, a half other than `len // 2` rows (at least 1)."""
    assert _slower_half_gain([0, 3, 1, 5]) == 1.5  # gains 1, 2 of 1, 2, 4, 6
    assert _slower_half_gain([2]) == 3.0
    assert _slower_half_gain([0, 4, 4]) == 1.0
    assert _slower_half_gain([3, 3, 0, 1, 1]) == 1.5  # gains 1, 2 of 1, 2, 2, 4, 4


def test_an_estimate_is_shrunk_toward_plain_steps_by_its_evidence_and_raised_by_its_spread():
    """Kills `_weighed` other than 1 + (e - 1) rows / (rows + evidence_rows), `_raised` other than
    e (1 + spread / sqrt(max(1, rows))), `_evidence` of a drafter that does not learn other than its
    measured row steps, and `_hopeful` raising an estimate beside plain steps or not beside a drafter."""
    c = _started(LiteralEstimates({}, {}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    c.measured[A] = (3, 64)
    assert c._evidence(A) == 64
    assert c._weighed(A, 3.0) == pytest.approx(2.0)
    assert c._raised(A, 2.0) == pytest.approx(2.0 * (1 + 0.8 / 8))
    assert c._weighed(B, 3.0) == 1.0  # no evidence: plain steps
    assert c._raised(B, 2.0) == pytest.approx(2.0 * 1.8)  # fewer than one row step counts as one
    assert c._hopeful(A, 2.0) == 2.0  # beside plain steps: as measured
    c.current = B
    assert c._hopeful(A, 2.0) == pytest.approx(2.2)
    assert c._hopeful(AUTOREGRESSIVE, 1.0) == 1.0


def test_a_learning_drafters_evidence_halves_every_idle_half_life():
    """Kills `_aged` other than 0.5 ** (idle rows / idle_half_life_rows) for a drafter that learns (or
    ageing one that does not), and `_evidence` of a learning drafter not taken from its own record."""
    c = _started(LiteralEstimates({}, {}), {A: DraftLimits(4, 4, learns=True), B: DraftLimits(4, 4)})
    c.evidence[A] = (100.0, 200)
    c.measured[A] = (10, 300)
    c.measured[B] = (10, 300)
    c.row_steps = 200 + 512
    assert c._aged(A) == pytest.approx(0.5)
    assert c._evidence(A) == pytest.approx(50.0)
    c.row_steps = 200 + 1024
    assert c._evidence(A) == pytest.approx(25.0)
    assert (c._aged(B), c._evidence(B)) == (1.0, 300)
    del c.evidence[A]
    assert c._evidence(A) == pytest.approx(300 * 0.5 ** (1224 / 512))  # before its own: what it measured


def test_a_drafters_time_window_spans_the_row_steps_its_tau_averages():
    """Kills `_row_window` other than max(time_window, ceil(2 smoothing_rows / -ln(1 - smoothing) / b))
    for a drafter, and other than `time_window` for plain steps or without smoothing."""
    c = _started(LiteralEstimates({}, {}), {A: DraftLimits(4, 4)})
    rows = 2 * 64 / -math.log(0.7)
    assert c._row_window((A, 1)) == math.ceil(rows) == 359
    assert c._row_window((A, 8)) == math.ceil(rows / 8) == 45
    assert c._row_window((A, 64)) == 9  # 6 < time_window
    assert c._row_window((AUTOREGRESSIVE, 1)) == 9
    flat = _started(LiteralEstimates({}, {}, smoothing=1.0), {A: DraftLimits(4, 4)})
    assert flat._row_window((A, 1)) == 9


def test_a_drafter_is_explored_enough_after_its_steps_and_rows_or_one_step_holding_both():
    """Kills `_measured_enough` with `>=` as `>`, `and` as `or`, or the large-batch case (rows at least
    explore_steps x explore_rows) other than that."""
    c = _started(LiteralEstimates({}, {}), {A: DraftLimits(4, 4)})
    for measured, enough in (((1, 8), False), ((2, 8), True), ((1, 16), True), ((5, 7), False), ((1, 15), False)):
        c.measured[A] = measured
        assert c._measured_enough(A) == enough, measured


def test_a_drafter_is_written_off_only_when_even_its_raised_estimate_loses():
    """Kills `_written_off` writing off before `explore_steps` steps, writing off a drafter that learns,
    or comparing its raised estimate with other than the better of plain steps and the current choice."""
    c = _started(LiteralEstimates({A: 0.7, B: 1.5}, {}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    c.measured[A] = (1, 100)
    assert not c._written_off(A, 1)  # one step: not yet
    c.measured[A] = (2, 100)
    assert c._written_off(A, 1)  # raised 0.7 x 1.08 = 0.756 < 1
    c.speedups[A] = 0.95
    assert not c._written_off(A, 1)  # raised 1.026 > 1
    c.current = B
    assert c._written_off(A, 1)  # below the current drafter's 1.5
    learner = _started(LiteralEstimates({A: 0.5}, {}), {A: DraftLimits(4, 4, learns=True)})
    learner.measured[A] = (20, 100)
    assert not learner._written_off(A, 1)


def test_a_resumed_drafter_costs_the_mean_of_its_last_starts():
    """Kills `_resume_cost` other than the mean of its recorded starts, or other than 0 without any."""
    c = _started(LiteralEstimates({}, {}), {A: DraftLimits(4, 4)})
    assert c._resume_cost(A, 1) == 0.0
    c.resume_setup[(A, 1)] = deque([0.5, 1.5, 4.0])
    assert c._resume_cost(A, 1) == pytest.approx(2.0)
    assert c._resume_cost(A, 2) == 0.0


def test_a_probe_waits_as_long_as_its_share_of_the_probe_budget_pays_for():
    """Kills `probe_wait` other than own (1 - hopeful / current estimate) + resume cost over the option's
    share of `probe_budget` (per option not failed), clamped to probe_every..max_probe_wait; `probe_every`
    where an estimate is unknown; 1 for a drafter on trial."""
    c = _started(LiteralEstimates({A: 0.5, B: 0.75}, {A: 2.0, B: 2.0}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    # Lost per probe of A beside plain steps: 2.0 x (1 - 0.5) = 1.0 plain steps; share 0.005 / 2.
    assert c.probe_wait(A, 1) == 400
    c.failed.add(B)
    assert c.probe_wait(A, 1) == 200
    c.resume_setup[(A, 1)] = deque([1.0])
    assert c.probe_wait(A, 1) == 400
    assert c.probe_wait(B, 1) == 100  # 2.0 x 0.25 / 0.005
    c.speedups[B] = 0.999
    assert c.probe_wait(B, 1) == 24  # below probe_every
    c.speedups[A] = 0.01
    c.ratios[A] = 50.0
    assert c.probe_wait(A, 1) == 2048  # beyond max_probe_wait
    c.speedups[A] = None
    assert c.probe_wait(A, 1) == 24


def test_a_drafter_whose_raised_estimate_beats_the_current_one_on_too_few_rows_is_on_trial():
    """Kills `_on_trial`: a trial beside plain steps, the bar other than the current estimate times
    1 + hysteresis, the raised estimate compared with `>=`, the weighed one with `<`; `probe_wait` then 1."""
    c = _started(LiteralEstimates({A: 1.5, B: 1.2}, {A: 1.0, B: 1.0}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    c.measured[A] = (2, 4)  # raised 1.5 x 1.4 = 2.1; weighed 1 + 0.5 x 4 / 68 = 1.03
    assert not c._on_trial(A, 1.5, 1.2)  # beside plain steps: never
    c.current = B
    assert c._on_trial(A, 1.5, 1.2)
    assert c.probe_wait(A, 1) == 1
    assert not c._on_trial(A, 1.5, 2.0)  # 2.1 < 2.0 x 1.05
    assert not c._on_trial(A, 1.5, 2.1 / 1.05)  # at the bar exactly: not above it
    c.measured[A] = (200, 10_000)  # weighed 1.49 > 1.26: a switch's business, not a trial's
    assert not c._on_trial(A, 1.5, 1.2)


def test_an_estimate_known_only_from_loaded_statistics_is_probed_when_it_would_switch():
    """Kills `_unconfirmed_best` picking other than the best estimate, one that has run here, one that
    would not beat the current choice by the hysteresis, or ignoring plain steps as the floor."""
    c = _started(LiteralEstimates({A: 1.3, B: 1.1}, {}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    options = [AUTOREGRESSIVE, A, B]
    assert c._unconfirmed_best(options, 1) == A
    c.last_used[A] = 3
    assert c._unconfirmed_best(options, 1) is None  # it ran here: its probe will come
    del c.last_used[A]
    c.speedups = {A: 1.04, B: 1.0}
    assert c._unconfirmed_best(options, 1) is None  # not above 1.05
    c.speedups[A] = 1.3
    c.current = B
    c.speedups[B] = 1.25
    assert c._unconfirmed_best(options, 1) is None  # 1.3 < 1.25 x 1.05
    c.speedups = {A: None, B: None}
    assert c._unconfirmed_best(options, 1) is None


def test_a_learning_drafter_is_fed_batches_while_its_estimate_may_still_pay():
    """Kills `worth_learning` refusing an unknown estimate, or comparing with `learn_above` other than `>=`."""
    c = _started(LiteralEstimates({A: 0.85}, {}), {A: DraftLimits(4, 4, learns=True)})
    assert c.worth_learning(A, 1)
    c.speedups[A] = 0.84
    assert not c.worth_learning(A, 1)
    c.speedups[A] = None
    assert c.worth_learning(A, 1)


def test_a_failed_drafter_is_dropped_from_the_batch_and_said_so():
    """Kills `drafter_failed` not recording the failure, keeping a standing plan, keeping the failed
    drafter as the current choice (or dropping another), or telling no event."""
    c = _started(LiteralEstimates({A: 2.0}, {A: 1.0}), {A: DraftLimits(4, 4), B: DraftLimits(4, 4)})
    c.current, c.standing = A, (1, 99, None)
    c.drafter_failed(B, "B raised")
    assert (c.failed, c.current) == ({B}, A)
    c.drafter_failed(A, "A raised")
    assert (c.failed, c.current, c.standing) == ({A, B}, AUTOREGRESSIVE, None)
    assert [(e["from"], e["to"], e["reason"]) for e in c.drain_events()] == [
        (B, AUTOREGRESSIVE, "B raised"),
        (A, AUTOREGRESSIVE, "A raised"),
    ]
    c.start_batch({A: DraftLimits(4, 4)}, 1)
    assert c.failed == set()


def test_a_batch_starts_from_learned_sizes_within_its_drafters_limits():
    """Kills `start_batch` sizing a drafter other than its start depth (or max depth without one), a
    learned size left above the limits, a tree's nodes other than min(learned, max_nodes), a chain's
    nodes other than its depth, the current choice kept when it is not offered, rows other than one
    per batch row."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(6, 6, start_depth=3), B: DraftLimits(5, 24, trees=True)}, 3)
    assert (c.depth, c.nodes) == ({A: 3, B: 5}, {A: 3, B: 24})
    assert len(c.rows) == 3
    c.depth[A], c.nodes[B], c.current = 5, 12, A
    c.start_batch({A: DraftLimits(4, 4), B: DraftLimits(5, 8, trees=True)}, 2)
    assert (c.depth, c.nodes, c.current) == ({A: 4, B: 5}, {A: 4, B: 8}, A)
    c.start_batch({B: DraftLimits(5, 16, trees=True)}, 1)
    assert (c.nodes[B], c.current) == (8, AUTOREGRESSIVE)


def test_a_row_whose_drafts_are_rejected_row_patience_times_running_cools_down():
    """Kills `_observe_rows`: a streak counted on accepted or undrafted rows, not reset by an acceptance,
    cooling at other than `row_patience`, for other than `row_cooldown` steps, or a row alone in its
    batch cooling; `_rows_off` other than the rows whose cooldown lasts past the next step; `keep_rows`
    and `add_rows` losing a row's streak or order."""
    c = AdaptiveController(ControllerSettings(row_patience=2, row_cooldown=5))
    c.start_batch({A: DraftLimits(4, 4)}, 3)
    c.observe(StepRecord(AUTOREGRESSIVE, 3, 0.03, [0, 0, 0], [0, 0, 0]))
    c.observe(StepRecord(A, 3, 0.03, [4, 4, 0], [0, 1, 0]))
    assert [r.streak for r in c.rows] == [1, 0, 0]
    c.observe(StepRecord(A, 3, 0.03, [4, 4, 4], [0, 0, 0]))  # row 0's second rejection: off until 3 + 5
    assert [(r.streak, r.off_until) for r in c.rows] == [(0, 8), (1, 0), (1, 0)]
    assert c._rows_off() == {0}
    c.step = 6
    assert c._rows_off() == {0}
    c.step = 7
    assert c._rows_off() == set()
    c.keep_rows([2, 0])
    c.add_rows(1)
    assert [(r.streak, r.off_until) for r in c.rows] == [(1, 0), (0, 8), (0, 0)]
    alone = AdaptiveController(ControllerSettings(row_patience=1))
    alone.start_batch({A: DraftLimits(4, 4)}, 1)
    alone.observe(StepRecord(A, 1, 0.01, [4], [0]))
    assert alone.rows == [RowDrafting(streak=1, off_until=0)]


def test_the_cost_ratio_of_an_unmeasured_bucket_is_the_nearest_measured_ones_the_larger_of_two():
    """Kills `cost_ratio` taking other than the nearest bucket by bit length, the smaller of two as near,
    a bucket where plain steps did not run, or not 1 for plain steps."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4)}, 1)
    for b, ratio in ((2, 1.2), (8, 1.8), (32, 3.0)):
        c.row_time[(AUTOREGRESSIVE, b)] = RecentTime(9, recent=deque([0.01]))
        c.row_time[(A, b)] = RecentTime(9, recent=deque([ratio]))
    c.row_time[(A, 64)] = RecentTime(9, recent=deque([9.0]))  # no plain steps at 64
    assert [c.cost_ratio(A, b) for b in (1, 2, 4, 8, 16, 64, 128)] == [1.2, 1.2, 1.8, 1.8, 3.0, 3.0, 3.0]
    assert c.cost_ratio(AUTOREGRESSIVE, 4) == 1.0


def test_a_step_is_measured_per_row_and_a_drafters_against_the_plain_step_before_it():
    """Kills `observe`/`_observe_times`: a plain step's time other than per row, a drafter's other than
    its per-row time over the plain step's (or kept before plain steps ran), the steps and row steps
    measured, `last_used`, `decode_s` without the setup, a resumed drafter's start other than per row
    over a plain step (or kept when it ran the step before, or when it learns), and a forward's time
    other than per row at its computed width; a drafter's host time other than the step less its
    forward, per row, over a plain step."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4), B: DraftLimits(4, 4, learns=True)}, 2)
    c.observe(StepRecord(A, 2, 0.05, [2, 2], [1, 1]))  # before any plain step: no ratio
    assert (A, 2) not in c.row_time and c.measured[A] == (1, 2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.02, [0, 0], [0, 0], forward_s=0.016))
    assert c.row_time[(AUTOREGRESSIVE, 2)].value == pytest.approx(0.01)
    assert c.forward.row_seconds(2, 1) == pytest.approx(0.008)
    c.observe(StepRecord(A, 2, 0.03, [2, 2], [1, 1], width=3, forward_s=0.02, setup_s=0.004, computed_width=2))
    assert c.row_time[(A, 2)].value == pytest.approx(1.5)
    assert list(c.resume_setup[(A, 2)]) == [pytest.approx(0.2)]  # 0.004 / 2 rows / 0.01
    assert c.host_time[(A, 2, 3)].value == pytest.approx(0.5)  # (0.03 - 0.02) / 2 / 0.01
    assert c.forward.times[(2, 2)].value == pytest.approx(0.01 / 0.008)  # at its computed width, as a ratio
    c.observe(StepRecord(A, 2, 0.03, [2, 2], [1, 1], setup_s=0.004))  # ran the step before: no start
    assert len(c.resume_setup[(A, 2)]) == 1
    c.observe(StepRecord(B, 2, 0.03, [2, 2], [1, 1], setup_s=0.004))  # learns: its counting is no start
    assert (B, 2) not in c.resume_setup
    assert (c.step, c.row_steps, c.measured[A], c.last_used) == (5, 10, (3, 6), {A: 4, AUTOREGRESSIVE: 2, B: 5})
    assert c.decode_s == pytest.approx(0.05 + 0.02 + 0.034 + 0.034 + 0.034)


def test_an_exploring_step_loses_only_what_it_took_beyond_plain_steps_moving_its_slower_half_as_far():
    """Kills the exploring loss other than setup + max(0, wall - plain x rows x slower-half gain), counted
    for a step that was not exploring, or the exploring flag kept after the step; `drain_exploring`
    other than the seconds since its last call."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4)}, 2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.02, [0, 0], [0, 0]))
    c.exploring = A
    c.observe(StepRecord(A, 2, 0.05, [3, 3], [0, 2], setup_s=0.01))  # slower half gains 1: plain 0.02
    assert (c.exploring_lost_s, c.exploring_s, c.exploring) == (pytest.approx(0.04), pytest.approx(0.06), None)
    c.observe(StepRecord(A, 2, 0.05, [3, 3], [0, 2]))  # not exploring
    c.exploring = A
    c.observe(StepRecord(A, 2, 0.01, [3, 3], [3, 3]))  # paid: lost nothing
    assert c.exploring_lost_s == pytest.approx(0.04)
    assert c.drain_exploring() == {"exploring_s": 0.07, "exploring_lost_s": 0.04, "decoding_s": 0.14}
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.02, [0, 0], [0, 0]))
    assert c.drain_exploring() == {"exploring_s": 0.0, "exploring_lost_s": 0.0, "decoding_s": 0.02}


def test_tau_is_kept_per_bucket_and_budget_asked_for_and_per_tree_budget():
    """Kills `_observe_gain`: a step's share other than its rows over `smoothing_rows` (at most 1), τ kept
    at other than the planned node budget (the learned one, the widest draft), a tree's τ by budget not
    kept or not dated in row steps; and a learning drafter's evidence not grown by the step's rows."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 8, trees=True), B: DraftLimits(4, 4, learns=True)}, 4)
    c.observe(StepRecord(AUTOREGRESSIVE, 4, 0.04, [0] * 4, [0] * 4))
    c.observe(StepRecord(A, 4, 0.04, [8, 8, 8, 8], [1, 3, 3, 3]))  # no plan: its learned 8 nodes
    c.planned_nodes[A] = 4
    c.observe(StepRecord(A, 4, 0.04, [4, 4, 4, 4], [0, 0, 1, 1]))
    assert c.tau[A].seen == pytest.approx(8 / 64)
    assert c.tau_at[A][(4, 8)].value == pytest.approx(3.0) and c.tau_at[A][(4, 4)].value == pytest.approx(1.0)
    assert c.tree_tau[A][8].value == pytest.approx(3.0) and c.tree_tau[A][4].value == pytest.approx(1.0)
    assert c.tree_tau_at == {(A, 8): 4, (A, 4): 8}
    c.observe(StepRecord(B, 4, 0.04, [2, 2, 2, 2], [1, 1, 1, 1]))
    assert c.evidence[B] == (4, 16)
    assert c.drafted_width[A].recent == deque([1, 1])


def test_forwards_timed_before_decoding_and_what_a_controller_learned_carry_over():
    """Kills `time_forwards` other than per row at the batch's bucket, the plain forward first;
    `learned`/`warm_start` losing a field or the windows of what they load."""
    c = AdaptiveController(ControllerSettings())
    c.start_batch({A: DraftLimits(4, 4)}, 3)
    c.time_forwards(3, {4: [0.06, 0.06, 0.06], 1: [0.03]})
    assert c.forward.row_seconds(4, 1) == pytest.approx(0.01)
    assert c.forward.row_seconds(4, 4) == pytest.approx(0.02)
    c.observe(StepRecord(AUTOREGRESSIVE, 3, 0.03, [0] * 3, [0] * 3))
    c.observe(StepRecord(A, 3, 0.045, [2] * 3, [1] * 3, width=3, forward_s=0.03))
    learned = c.learned()
    warm = AdaptiveController(ControllerSettings())
    warm.warm_start(learned)
    assert warm.learned() == learned
    assert warm.row_time[(A, 4)].window == c._row_window((A, 4))
    assert warm.measured == {AUTOREGRESSIVE: (1, 3), A: (1, 3)} and warm.depth == {A: 4}

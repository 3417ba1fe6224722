"""The adaptive controller: estimates and hysteresis on literal statistics; fallbacks end to end."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from scripted_proposer import ScriptedProposer
from transformers import AutoModelForCausalLM

from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController, ControllerSettings, Learned, bucket
from strategies.control.cost_model import FORWARD_SAMPLES, ForwardCosts, RecentTime, best_chain_depth
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.kv_cache import SlotLayer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, Plan, StepRecord
from strategies.verification.drafting import DraftingMethod
from strategies.verification.speculative import SpeculativeStrategy

LOOKUP = "lookup"
CHAIN_OF_4 = DraftLimits(4, 4)
LOOKUP_3_TO_6 = DraftLimits(6, 6, start_depth=3)  # drafts start at 3 tokens and may grow to 6


def _controller(limits: DraftLimits = CHAIN_OF_4, **settings) -> AdaptiveController:
    # Every plan weighs the options again (replan_rows=1): these tests follow the estimates step by step.
    settings = {"replan_rows": 1, **settings}
    controller = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1, probe_every=1000, **settings))
    controller.start_batch({LOOKUP: limits}, batch_size=2)
    return controller


def _step(controller, drafter, wall_s, accepted, drafted=(4, 4)):
    plan = controller.plan(2)
    controller.observe(StepRecord(drafter, 2, wall_s, list(drafted), list(accepted)))
    return plan


def test_tau_starts_as_a_plain_mean_so_one_unlucky_first_step_does_not_stand():
    c = _controller(time_window=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.01, [0], [0]))  # as dear as a lookup step: speed-up = τ
    for accepted in (0, 3, 3, 3):  # batch 1: a step weighs 1/64 of a full moving-average weight
        c.observe(StepRecord(LOOKUP, 1, 0.01, [4], [accepted]))
    assert c.speedup(LOOKUP, 1) == pytest.approx(3.25)


def test_step_times_are_recent_means_without_pauses():
    times = RecentTime(window=6)
    for x in (9.0, 1.0, 1.0, 1.0, 1.5, 1.5, 30.0):  # 9.0 leaves the window; 30.0 is a pause
        times.update(x)
    assert times.value == pytest.approx(1.2)  # a drafter's two kinds of step, averaged


def test_buckets_are_powers_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32)] == [1, 2, 4, 4, 8, 8, 16, 32]


def test_estimate_is_tokens_per_second_relative_to_plain_steps():
    c = _controller()
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    _step(c, LOOKUP, 0.015, [2, 2])  # 3 tokens per row in 1.5x the time of a plain step
    assert c.speedup(LOOKUP, 2) == pytest.approx(2.0)
    assert c.plan(2).drafter == LOOKUP  # 2.0 > 1.05: speculation on


def test_hysteresis_keeps_the_choice_near_break_even_and_switches_off_below():
    c = _controller(smoothing=1.0, time_window=1)  # no smoothing: each measurement is the estimate
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    _step(c, LOOKUP, 0.010, [1, 1])
    assert c.plan(2).drafter == LOOKUP
    c.observe(StepRecord(LOOKUP, 2, 0.0103, [4, 4], [0, 0]))  # estimate 0.97: inside the ±5% band
    assert c.speedup(LOOKUP, 2) == pytest.approx(0.971, abs=1e-3) and c.plan(2).drafter == LOOKUP
    c.observe(StepRecord(LOOKUP, 2, 0.013, [4, 4], [0, 0]))  # 0.77: off
    assert c.plan(2).drafter == AUTOREGRESSIVE
    events = c.drain_events()
    assert events[-1]["from"] == LOOKUP and events[-1]["to"] == AUTOREGRESSIVE and "estimates" in events[-1]
    c.observe(StepRecord(LOOKUP, 2, 0.0100, [4, 4], [1, 1]))  # 2 tokens per row: back on above 1.05
    assert c.plan(2).drafter == LOOKUP


def test_a_drafters_estimate_averages_its_time_over_the_steps_its_tau_averages():
    """Prompt lookup drafts in streaks: a verify when the context repeats (here 3 tokens for two plain
    steps' time), a plain step when it found nothing (1 token, one plain step). Over 20 of each the
    speed-up is 2 tokens for 1.5 plain steps; a time window of the last few steps alone would say 2.0
    after a streak of cheap steps, and switch a drafter off and on with the kind of its last steps."""
    c = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1, probe_every=10**6))
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
    for _ in range(20):
        c.observe(StepRecord(LOOKUP, 1, 0.020, [4], [2]))
    for _ in range(20):
        c.observe(StepRecord(LOOKUP, 1, 0.010, [0], [0]))
    assert c.speedup(LOOKUP, 1) == pytest.approx(2 / 1.5)


def _lookup_chosen_at_1_5x_over_500_rows_then(other: str) -> AdaptiveController:
    """A controller at batch 1 (no smoothing, probes only on trial) that chose LOOKUP on 500 row steps at
    1.5x, in a batch where `other` is available too, unmeasured."""
    settings = ControllerSettings(
        explore_steps=1, explore_rows=1, probe_every=10**6, max_probe_wait=10**6, smoothing=1.0, time_window=1
    )
    c = AdaptiveController(settings)
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
    for _ in range(500):
        c.observe(StepRecord(LOOKUP, 1, 0.020, [4], [2]))  # 3 tokens in two plain steps' time: 1.5x
    assert c.plan(1).drafter == LOOKUP
    c.start_batch({LOOKUP: CHAIN_OF_4, other: CHAIN_OF_4}, batch_size=1)
    return c


def test_a_paying_drafter_gives_way_only_to_an_estimate_resting_on_enough_rows():
    """At batch 1 a few steps are one prompt's luck: a drafter measured over 8 row steps at 2.0x does not
    displace one measured over 500 at 1.5x; measured over 600 more, it does."""
    other = "other"
    c = _lookup_chosen_at_1_5x_over_500_rows_then(other)
    for _ in range(8):
        c.observe(StepRecord(other, 1, 0.010, [4], [1]))  # 2 tokens in one plain step's time: 2.0x
    assert c.speedup(other, 1) == pytest.approx(2.0) and c.speedup(LOOKUP, 1) == pytest.approx(1.5)
    plan = c.plan(1)  # 2.0 on 8 rows weighs 1 + 1.0 · 8 / (8 + 64) = 1.11: no switch,
    assert c.current == LOOKUP and plan.drafter == other  # but a trial of the drafter expected to win
    for _ in range(600):
        c.observe(StepRecord(other, 1, 0.010, [4], [1]))
    assert c.plan(1).drafter == other and c.current == other  # on 608 rows: 1.90 > 1.5 · 1.05


def test_a_drafter_expected_to_win_on_thin_evidence_runs_on_trial_until_it_wins_or_falls_back():
    """Probes one step apart would give a challenger at batch 1 one row step each: a trial runs it
    step after step, while its estimate beats the current choice's by more than the hysteresis."""
    other = "other"
    c = _lookup_chosen_at_1_5x_over_500_rows_then(other)
    c.observe(StepRecord(other, 1, 0.010, [4], [1]))  # 2.0x on one row step: weighs 1.02, no switch
    trial = []
    for _ in range(400):
        plan = c.plan(1)
        trial.append(plan.drafter)
        c.observe(StepRecord(plan.drafter, 1, 0.010, [4], [1]))  # it keeps drafting 2 tokens a plain step
    assert set(trial) == {other}  # every step: its probes need no wait
    assert c.current == other  # 2.0 on 401 rows weighs 1.86 > 1.5 · 1.05
    # Measured lower on its next step, it is probed as before: rarely.
    c = _lookup_chosen_at_1_5x_over_500_rows_then(other)
    c.observe(StepRecord(other, 1, 0.010, [4], [1]))  # 2.0x
    assert c.plan(1).drafter == other
    c.observe(StepRecord(other, 1, 0.020, [4], [1]))  # 2 tokens in two plain steps' time: 1.0x
    assert c.speedup(other, 1) == pytest.approx(1.0) and c.probe_wait(other, 1) == 10**6
    assert c.plan(1).drafter == LOOKUP


def test_a_drafter_on_few_rows_is_probed_beside_another_as_if_its_estimate_lay_a_spread_higher():
    """Beside a drafter at 1.5x on 500 row steps, one at 1.25x on 16 may be worth more (one prompt's luck,
    or a cold Lookahead trie): weighed at 1.25 · (1 + 0.8 / √16) = 1.5 a probe loses nothing, and it
    comes every `probe_every` steps. Weighed as measured, a probe loses 1.6 · (1 − 1.25 / 1.5) = 0.27
    plain steps, at 0.25% of the time (the budget's half) against the current 2-plain-step choice: 53
    steps apart. On 400 row steps its spread is 4%, and the wait is near that again. On 4 row steps it
    is weighed at 1.75, above 1.5 · 1.05: it runs on trial, a step at a time. Beside plain steps, where
    nothing pays, a probe is weighed as measured."""
    other = "other"

    def beside(current_rows: int, other_rows: int, spread: float = 0.8) -> AdaptiveController:
        settings = ControllerSettings(
            explore_steps=1, explore_rows=1, probe_every=24, max_probe_wait=10**6, smoothing=1.0, time_window=1
        )
        c = AdaptiveController(dataclasses.replace(settings, probe_spread=spread))
        c.start_batch({LOOKUP: CHAIN_OF_4, other: CHAIN_OF_4}, batch_size=1)
        c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
        for _ in range(current_rows):
            c.observe(StepRecord(LOOKUP, 1, 0.020, [4], [2]))  # 3 tokens in two plain steps' time: 1.5x
        for _ in range(other_rows):
            c.observe(StepRecord(other, 1, 0.016, [4], [1]))  # 2 tokens in 1.6 plain steps' time: 1.25x
        c.current = LOOKUP if current_rows else AUTOREGRESSIVE
        return c

    assert beside(500, 16).probe_wait(other, 1) == 24
    assert beside(500, 16, spread=0.0).probe_wait(other, 1) == 53
    assert beside(500, 400).probe_wait(other, 1) == 42  # 1.25 · 1.04 = 1.3: 1.6 · (1 − 1.3 / 1.5) / 0.005
    assert beside(500, 4).probe_wait(other, 1) == 1
    plain = beside(0, 4)  # 1.25x beside plain steps: a probe gains, whatever the spread
    assert plain.probe_wait(other, 1) == 24 and plain._hopeful(other, 1.25) == 1.25


def test_drafters_are_ranked_on_their_estimates_weighed_by_the_rows_behind_them():
    """Turning speculation on, the drafter chosen is the one whose estimate, shrunk toward 1 by
    n / (n + 64), is best: 1.5x on 500 row steps (1.44) over 1.6x on 8 (1.07). The other, weighed at
    its spread above (1.6 · (1 + 0.8 / √8) = 2.05), then runs on trial."""
    other = "other"
    settings = ControllerSettings(
        explore_steps=1, explore_rows=1, probe_every=10**6, max_probe_wait=10**6, smoothing=1.0, time_window=1
    )
    c = AdaptiveController(settings)
    c.start_batch({other: CHAIN_OF_4, LOOKUP: CHAIN_OF_4}, batch_size=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
    for _ in range(8):
        c.observe(StepRecord(other, 1, 0.0125, [4], [1]))  # 2 tokens in 1.25 plain steps' time: 1.6x
    for _ in range(500):
        c.observe(StepRecord(LOOKUP, 1, 0.020, [4], [2]))  # 3 tokens in two plain steps' time: 1.5x
    assert c.speedup(other, 1) == pytest.approx(1.6) and c.speedup(LOOKUP, 1) == pytest.approx(1.5)
    assert c.plan(1).drafter == other and c.current == LOOKUP


def test_speculation_comes_on_only_on_fresh_evidence():
    """A drafter's step time is kept against the plain step's when it ran: when the machine slows down
    its old measurement does not look faster than it was, and only a step of it now can switch it on."""
    c = _controller(smoothing=1.0, time_window=1)  # each measurement is the estimate
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    _step(c, LOOKUP, 0.030, [0, 0])  # a third as fast as plain steps
    for _ in range(5):
        _step(c, AUTOREGRESSIVE, 0.050, [0, 0], drafted=(0, 0))  # the machine slows down five times
    assert c.speedup(LOOKUP, 2) == pytest.approx(1 / 3)  # not 5 / 3: 0.030 s was three plain steps then
    assert c.plan(2).drafter == AUTOREGRESSIVE
    c.observe(StepRecord(LOOKUP, 2, 0.030, [4, 4], [0, 0]))  # run now: 0.6 of a plain step
    assert c.speedup(LOOKUP, 2) == pytest.approx(5 / 3) and c.plan(2).drafter == LOOKUP


def test_tau_is_the_slower_half_of_the_rows():
    """A batch waits for its slowest rows: gains of 1 and 4 tokens count as the slower half's 1."""
    c = _controller(smoothing=1.0)
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    c.observe(StepRecord(LOOKUP, 2, 0.010, [4, 4], [0, 3]))
    assert c.speedup(LOOKUP, 2) == 1.0 and c.plan(2).drafter == AUTOREGRESSIVE
    c.observe(StepRecord(LOOKUP, 1, 0.005, [4], [3]))  # one row: its own gain
    assert c.speedup(LOOKUP, 1) == pytest.approx(4.0)  # τ 4 at the cost of a plain step


def test_tau_is_every_rows_mean_once_rows_join_the_batch():
    """Where finished rows' places are filled (a job's engine), no tail waits for the slow rows: gains
    of 1 and 4 count as their mean, 2.5, until the next batch starts without joining rows."""
    c = _controller(smoothing=1.0)
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    c.keep_rows([0])
    c.add_rows(1)
    c.observe(StepRecord(LOOKUP, 2, 0.010, [4, 4], [0, 3]))
    assert c.speedup(LOOKUP, 2) == pytest.approx(2.5) and c.plan(2).drafter == LOOKUP
    c.start_batch({LOOKUP: DraftLimits(4, 4)}, 2)
    c.observe(StepRecord(LOOKUP, 2, 0.010, [4, 4], [0, 3]))
    assert c.speedup(LOOKUP, 2) == 1.0


def _probe_steps(settings: ControllerSettings, lookup_wall_s: float, steps: int = 40) -> list[int]:
    """Steps at which a lookup drafter that gains nothing (τ = 1) is tried, its steps taking `lookup_wall_s`
    against 0.01 s for a plain step."""
    c = AdaptiveController(settings)
    c.start_batch({LOOKUP: DraftLimits(4, 4)}, 2)
    tried = []
    for _ in range(steps):
        plan = c.plan(2)
        slow = plan.drafter == LOOKUP
        c.observe(StepRecord(plan.drafter, 2, lookup_wall_s if slow else 0.01, [4, 4] if slow else [0, 0], [0, 0]))
        if slow:
            tried.append(c.step)
    return tried


def test_probes_come_back_spaced_by_what_they_cost():
    # Half as fast as plain steps: a probe loses 0.02 s × 0.5 = 0.01 s; with probes allowed 10% of
    # the time (0.001 s per 0.01 s step) that is one probe per 10 steps, after the exploration at step 2.
    settings = ControllerSettings(explore_steps=1, explore_rows=1, probe_every=5, probe_budget=0.1, max_probe_wait=1000)
    assert _probe_steps(settings, 0.02) == [2, 12, 22, 32]
    # Never later than max_probe_wait: no fallback is permanent.
    assert _probe_steps(dataclasses.replace(settings, max_probe_wait=8), 0.02) == [2, 10, 18, 26, 34]
    # Nearly as fast as plain steps: probing costs almost nothing, so it comes every probe_every steps.
    assert _probe_steps(settings, 0.0105) == [2, 7, 12, 17, 22, 27, 32, 37]


def test_plain_steps_run_unasked_until_the_next_probe():
    settings = ControllerSettings(explore_steps=1, explore_rows=1, probe_every=5, probe_budget=0.1, max_probe_wait=1000)
    c = AdaptiveController(settings)
    c.start_batch({LOOKUP: DraftLimits(4, 4)}, 2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
    c.observe(StepRecord(LOOKUP, 2, 0.02, [4, 4], [0, 0]))  # a probe every 10 steps (see above)
    plan = c.plan(2)
    assert plan.drafter == AUTOREGRESSIVE and plan.steps == 9  # steps 3-11; step 12 probes
    for _ in range(plan.steps):
        c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
    assert c.plan(2).drafter == LOOKUP
    # Without a drafter to probe, plain steps go on until a row finishes.
    c.start_batch({}, 2)
    assert c.plan(2).steps is None


def test_options_share_the_probe_budget():
    waits = []
    for drafters in ({LOOKUP: DraftLimits(4, 4)}, {LOOKUP: DraftLimits(4, 4), "other": DraftLimits(4, 4)}):
        c = AdaptiveController(ControllerSettings(probe_every=1, probe_budget=0.1, max_probe_wait=1000))
        c.start_batch(drafters, 2)
        c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
        c.observe(StepRecord(LOOKUP, 2, 0.02, [4, 4], [0, 0]))  # loses 0.01 s a probe
        waits.append(c.probe_wait(LOOKUP, 2))
    assert waits == [10, 20]  # two options not in use: each may lose half of the 10%


def test_a_probe_that_starts_a_drafter_again_is_spaced_by_the_start_too_unless_the_drafter_learns():
    """A draft model's probe in a new batch prefills its rows first: that start is part of what a probe
    costs. A Lookahead's counting of what was emitted while it rested is learning, paid wherever it runs."""
    waits = []
    for limits in (DraftLimits(4, 4), DraftLimits(4, 4, learns=True)):
        c = AdaptiveController(ControllerSettings(probe_every=1, probe_budget=0.1, max_probe_wait=1000))
        c.start_batch({LOOKUP: limits}, 2)
        c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
        # Loses 0.01 s in its step, and its start took two plain steps' time (0.02 s over 2 rows).
        c.observe(StepRecord(LOOKUP, 2, 0.02, [4, 4], [0, 0], setup_s=0.02))
        waits.append(c.probe_wait(LOOKUP, 2))
    assert waits == [30, 10]  # 3 plain steps lost a probe in 10% of the time; the learning one's start not counted


def test_a_hopeless_option_is_probed_rarely_with_default_settings():
    c = AdaptiveController()
    c.start_batch({LOOKUP: DraftLimits(4, 4)}, 2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
    c.observe(StepRecord(LOOKUP, 2, 0.05, [4, 4], [1, 1]))  # speed-up 0.4 at five times the cost
    assert c.probe_wait(LOOKUP, 2) == 600  # a probe loses 5 x 0.6 = 3 plain steps: 0.5% of 600
    c.observe(StepRecord(LOOKUP, 2, 0.50, [4, 4], [1, 1]))  # fifty times the cost: the longest wait
    assert c.probe_wait(LOOKUP, 2) == c.settings.max_probe_wait


def test_rows_whose_drafts_keep_failing_step_plainly_for_a_while():
    c = _controller(row_patience=2, row_cooldown=3)
    _step(c, AUTOREGRESSIVE, 0.01, [0, 0], drafted=(0, 0))
    for _ in range(2):
        c.observe(StepRecord(LOOKUP, 2, 0.005, [4, 4], [0, 3]))
    plan = c.plan(2)
    assert plan.rows_off == {0}
    assert any(e["scope"] == "row" and e["row"] == 0 for e in c.drain_events())
    # A batch of one row: the batch estimate decides, not the row's streak.
    c.keep_rows([0])
    for _ in range(4):
        c.observe(StepRecord(LOOKUP, 1, 0.005, [4], [0]))
    assert not c.drain_events()
    assert c.plan(1).rows_off == set()


def test_best_chain_depth_maximises_tokens_per_step_cost():
    # α 0.55, a draft token costing 0.1 plain step: E/(1 + ck) = 1.41, 1.54, 1.55, 1.51 for k = 1..4.
    def linear(cost_per_token: float, max_depth: int) -> list[float]:
        return [1 + cost_per_token * k for k in range(1, max_depth + 1)]

    assert best_chain_depth(0.55, linear(0.1, 8)) == 3
    assert best_chain_depth(0.9, linear(0.05, 8)) == 8
    assert best_chain_depth(0.2, linear(0.3, 8)) == 1
    assert best_chain_depth(1.0, linear(0.5, 5)) == 5  # never rejected: as long as allowed
    assert best_chain_depth(0.3, linear(0.0, 6)) == 6  # free drafts: as long as allowed


def test_chain_depth_moves_toward_the_best_one_token_at_a_time():
    c = _controller(DraftLimits(6, 6), resize_rows=4)  # a decision every 4 drafted row steps: 2 steps of 2 rows
    assert c.draft_size(LOOKUP) == (6, 6)  # a chain starts as long as allowed
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    for depth in (5, 4, 3, 2, 1):  # always rejected: toward 1, one token per decision
        c.observe(StepRecord(LOOKUP, 2, 0.013, [3, 3], [0, 0]))
        assert c.draft_size(LOOKUP)[0] == depth + 1  # one step is not yet evidence
        c.observe(StepRecord(LOOKUP, 2, 0.013, [3, 3], [0, 0]))
        assert c.draft_size(LOOKUP) == (depth, depth)
    c.observe(StepRecord(LOOKUP, 2, 0.012, [1, 1], [1, 1]))  # a draft token costs 0.2 plain step
    c.observe(StepRecord(LOOKUP, 2, 0.012, [1, 1], [1, 1]))  # never rejected: toward 6
    assert c.draft_size(LOOKUP) == (2, 2)


def test_tree_budget_follows_what_a_node_yields_against_what_it_costs():
    c = _controller(DraftLimits(8, 16, trees=True), resize_rows=2, min_tree_nodes=4, smoothing=1.0, time_window=1)
    assert c.draft_size(LOOKUP) == (8, 16)  # a tree starts with its whole node budget
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    # A 16-node step costs 2.6 plain steps: 0.1 a node. 3 of 32 nodes accepted: under that, halve.
    c.observe(StepRecord(LOOKUP, 2, 0.026, [16, 16], [1, 2]))
    assert c.draft_size(LOOKUP) == (8, 8)
    c.observe(StepRecord(LOOKUP, 2, 0.012, [8, 8], [0, 0]))  # 0.025 a node, nothing accepted: halve
    assert c.draft_size(LOOKUP) == (8, 4)
    c.observe(StepRecord(LOOKUP, 2, 0.012, [4, 4], [0, 0]))
    assert c.draft_size(LOOKUP) == (8, 4)  # never under min_tree_nodes
    c.observe(StepRecord(LOOKUP, 2, 0.011, [4, 4], [1, 0]))  # 1 of 8 (0.125) against 0.025: grow
    assert c.draft_size(LOOKUP) == (8, 8)
    c.observe(StepRecord(LOOKUP, 2, 0.018, [8, 8], [1, 1]))  # 0.125 against 0.1 a node: keep
    assert c.draft_size(LOOKUP) == (8, 8)


def test_a_chain_drafter_with_room_for_more_nodes_than_its_depth_is_sized_as_a_chain():
    """Lookahead's mode `one` drafts one branch of at most 8 tokens within a 16-node budget."""
    c = _controller(DraftLimits(8, 16, trees=False), resize_rows=2, time_window=1)
    assert c.draft_size(LOOKUP) == (8, 8)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    c.observe(StepRecord(LOOKUP, 2, 0.026, [8, 8], [0, 0]))  # as a tree it would halve its nodes to 8
    assert c.draft_size(LOOKUP) == (7, 7)


def test_lookahead_says_whether_it_drafts_trees(runner):
    for mode, trees in (("hier", True), ("one", False)):
        options = StrategyOptions(name="lookahead")
        options.lookahead.mode = mode
        strategy = registry.create(options, registry.Models(runner))
        assert strategy.drafters["lookahead"].trees is trees


# -- end to end: the controller inside the speculative loop (float64, exact) ---------------------

PROMPTS = [[5, 6, 7, 8, 9], [13], [14, 15, 16], [17, 18, 19, 20, 21, 22]]
PARAMS = GenerationParams(40, SamplingParams(), frozenset(), ignore_eos=True)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


@pytest.fixture(scope="module")
def reference(runner):
    return [r.tokens for r in AutoregressiveStrategy(runner).generate(_requests(), PARAMS).rows]


def _requests():
    return [RowRequest(list(p), i) for i, p in enumerate(PROMPTS)]


class CostModelController(AdaptiveController):
    """Sees modelled step times (a verify step costs 10% more per draft token, all of it in the forward)
    instead of measured ones, so the end-to-end tests do not depend on the machine's timing noise."""

    def observe(self, record: StepRecord) -> None:
        seconds = 0.01 * (1 + 0.1 * max(record.drafted, default=0))
        super().observe(dataclasses.replace(record, wall_s=seconds, forward_s=seconds))


def _adaptive(runner, proposer, **settings):
    # A 40-token batch is too short for 3% of its time to pay for a drafter's first step: these tests
    # are about what follows that step, so its cost is not capped here.
    settings = {"explore_budget": 1.0, **settings}
    controller = CostModelController(ControllerSettings(explore_steps=1, probe_every=1000, **settings))
    return SpeculativeStrategy("scripted", runner, [DraftingMethod("scripted", proposer, 4, 4)], controller), controller


def test_an_always_wrong_proposer_is_switched_off_quickly(runner, reference):
    strategy, _ = _adaptive(runner, ScriptedProposer(reference, 300, right=False))
    out = strategy.generate(_requests(), PARAMS)
    assert [r.tokens for r in out.rows] == reference
    steps = out.stats["steps_by_drafter"]
    assert steps.get("scripted", 0) <= 2 and steps[AUTOREGRESSIVE] > 30
    assert all(r.strategy == AUTOREGRESSIVE for r in out.rows)


def test_a_perfect_proposer_stays_on(runner, reference):
    strategy, _ = _adaptive(runner, ScriptedProposer(reference, 300))
    out = strategy.generate(_requests(), PARAMS)
    assert [r.tokens for r in out.rows] == reference
    steps = out.stats["steps_by_drafter"]
    assert steps["scripted"] >= 3 * steps.get(AUTOREGRESSIVE, 0)
    assert all(r.strategy == "scripted" for r in out.rows)


def test_a_raising_proposer_falls_back_with_exact_output(runner, reference):
    strategy, controller = _adaptive(runner, ScriptedProposer(reference, 300, fail_at=3))
    out = strategy.generate(_requests(), PARAMS)
    assert [r.tokens for r in out.rows] == reference
    assert any("proposer broke" in f for f in out.stats["faults"]["scripted"])
    assert any(e["from"] == "scripted" and "raised" in e["reason"] for e in controller.drain_events())


def test_out_of_memory_inside_the_verify_forward_leaves_caches_intact(runner, reference, monkeypatch):
    """A CUDA OOM raised mid-forward (after some layers wrote the cache) redoes the step plainly."""
    real_update = SlotLayer.update
    state = {"calls": 0, "raised": 0}

    def flaky_update(self, key_states, value_states, *args, **kwargs):
        state["calls"] += 1
        if self.length > 0 and key_states.shape[-2] > 1 and state["raised"] < 2 and state["calls"] % 2 == 0:
            state["raised"] += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_update(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(SlotLayer, "update", flaky_update)
    for controller in (True, False):
        state.update(calls=0, raised=0)
        if controller:
            strategy, _ = _adaptive(runner, ScriptedProposer(reference, 300))
        else:
            strategy = SpeculativeStrategy(
                "scripted", runner, [DraftingMethod("scripted", ScriptedProposer(reference, 300), 4, 4)]
            )
        out = strategy.generate(_requests()[:1], PARAMS)
        assert state["raised"] >= 1
        assert out.rows[0].tokens == reference[0]
        assert any("OutOfMemoryError" in f for f in out.stats["faults"]["scripted"])


class ScheduleController(AdaptiveController):
    """Plain steps until `first_draft`, then the drafters in turn: drafters start after rows have
    finished. `learn` answers `worth_learning` (a Lookahead trie fed from the batch's start, or not)."""

    def __init__(self, first_draft: int, learn: bool):
        super().__init__()
        self.first_draft, self.learn = first_draft, learn
        self.planned = 0

    def plan(self, batch_size):
        self.planned += 1
        names = sorted(self.limits, reverse=True)  # speculative, prompt_lookup, lookahead
        if self.planned < self.first_draft or not names:
            return Plan(AUTOREGRESSIVE, 0, 0)
        name = names[(self.planned - self.first_draft) % len(names)]
        limits = self.limits[name]
        return Plan(name, limits.start_depth or limits.max_depth, limits.start_nodes or limits.max_nodes)

    def worth_learning(self, drafter, batch_size):
        return self.learn


@pytest.mark.parametrize("learn", [False, True], ids=["lazy", "eager"])
def test_drafters_started_mid_batch_after_rows_finished_equal_greedy(runner, tiny_draft_dir, learn):
    """A 70-token prompt meets the 96-token context after 26 tokens; the drafters start at step 28."""
    draft = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_draft_dir, dtype=torch.float64))
    options = StrategyOptions(name="auto")
    prompts = [list(range(5, 75)), [13], [14, 15, 16] * 3, [17, 18, 19, 20, 21, 22]]
    requests = [RowRequest(p, i) for i, p in enumerate(prompts)]
    params = GenerationParams(60, SamplingParams(), frozenset(), ignore_eos=True)
    reference = AutoregressiveStrategy(runner).generate(requests, params).rows
    strategy = registry.create(
        options, registry.Models(runner, draft=draft), ScheduleController(first_draft=28, learn=learn)
    )
    out = strategy.generate(requests, params)
    assert [r.tokens for r in out.rows] == [r.tokens for r in reference]
    assert len(reference[0].tokens) == 26 and all(len(r.tokens) == 60 for r in reference[1:])
    steps = out.stats["steps_by_drafter"]
    assert {"speculative", "prompt_lookup", "lookahead"} <= set(steps) and steps[AUTOREGRESSIVE] == 27


@pytest.mark.parametrize("learn", [False, True], ids=["lazy", "eager"])
def test_a_drafter_never_planned_starts_only_to_learn(runner, learn):
    strategy = registry.create(
        StrategyOptions(name="auto", candidates=["lookahead"]),
        registry.Models(runner),
        ScheduleController(10**6, learn),
    )
    out = strategy.generate(_requests(), PARAMS)
    assert out.stats["steps_by_drafter"] == {AUTOREGRESSIVE: 39}
    assert ("trie_nodes" in out.stats) == learn  # a started proposer reports its statistics


# -- drafts that lengthen, and a controller warm from an earlier job's statistics ------------------


def test_chain_drafts_lengthen_from_their_start_while_accepted_and_stop_at_the_cap():
    c = _controller(DraftLimits(6, 6, start_depth=3), resize_rows=2)  # a decision every step of 2 rows
    assert c.draft_size(LOOKUP) == (3, 3)  # starts at the configured length, not the cap
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    for depth in (4, 5, 6, 6, 6):  # every draft accepted whole: one token longer per decision, up to the cap
        drafted = c.draft_size(LOOKUP)[0]
        c.observe(StepRecord(LOOKUP, 2, 0.011, [drafted, drafted], [drafted, drafted]))
        assert c.draft_size(LOOKUP) == (depth, depth)
    for depth in (5, 4, 3):  # rejected at the first token (α 0): one token shorter per decision
        c.observe(StepRecord(LOOKUP, 2, 0.013, [depth + 1, depth + 1], [0, 0]))
        assert c.draft_size(LOOKUP) == (depth, depth)


def test_prompt_lookup_fixed_starts_at_num_speculative_tokens_and_by_acceptance_may_draft_to_its_cap(runner):
    options = StrategyOptions(name="prompt_lookup", num_speculative_tokens=3)
    options.prompt_lookup.sizing = "fixed"
    lookup = registry.create(options, registry.Models(runner)).drafters["prompt_lookup"]
    assert (lookup.start_depth, lookup.max_depth, lookup.proposer.sizes_own_drafts) == (3, 10, False)
    options.num_speculative_tokens = 12  # the cap never shortens the configured start
    lookup = registry.create(options, registry.Models(runner)).drafters["prompt_lookup"]
    assert (lookup.start_depth, lookup.max_depth) == (12, 12)
    options.prompt_lookup.sizing = "acceptance"  # the default: the proposer cuts each draft within the cap
    lookup = registry.create(options, registry.Models(runner)).drafters["prompt_lookup"]
    assert (lookup.start_depth, lookup.max_depth, lookup.proposer.sizes_own_drafts) == (12, 12, True)


def _learned_controller(lookup_wall_s: float) -> AdaptiveController:
    """A controller that measured plain steps and a lookup drafter gaining 3 tokens a step at batch 2."""
    c = _controller(LOOKUP_3_TO_6, resize_rows=2)
    for _ in range(2):
        _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    for _ in range(4):
        _step(c, LOOKUP, lookup_wall_s, [2, 2], drafted=(2, 2))
    return c


def _warm(learned, limits: DraftLimits = LOOKUP_3_TO_6) -> AdaptiveController:
    c = AdaptiveController(ControllerSettings(probe_every=1000))  # default exploration: 2 steps, 8 row steps
    c.warm_start(learned)
    c.start_batch({LOOKUP: limits}, batch_size=2)
    return c


def test_a_warm_controller_drafts_from_its_first_steps_after_one_fresh_measurement():
    learned = _learned_controller(0.015).learned()
    assert learned.depth[LOOKUP] == 6  # accepted whole: grown from 3 to the cap
    c = _warm(learned)
    assert c.speedup(LOOKUP, 2) == pytest.approx(2.0)
    plan = c.plan(2)  # no exploration: one step of the favoured drafter, at its learned size
    assert (plan.drafter, plan.depth) == (LOOKUP, 6)
    c.observe(StepRecord(LOOKUP, 2, 0.015, [6, 6], [2, 2]))
    assert c.plan(2).drafter == LOOKUP and c.drain_events()[-1]["to"] == LOOKUP
    cold = AdaptiveController(ControllerSettings(probe_every=1000))
    cold.start_batch({LOOKUP: LOOKUP_3_TO_6}, batch_size=2)
    assert cold.plan(2).drafter == AUTOREGRESSIVE  # a cold one explores plain steps first


def test_a_warm_controller_leaves_off_a_drafter_its_statistics_found_slow():
    c = _warm(_learned_controller(0.05).learned())  # 3 tokens in 5 plain steps' time: 0.6
    plan = c.plan(2)
    assert (plan.drafter, plan.steps) == (AUTOREGRESSIVE, 999)  # plain steps until its probe is due
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    assert c.plan(4).drafter == AUTOREGRESSIVE  # a new batch bucket: plain steps measured there first
    assert c.cost_ratio(LOOKUP, 4) == pytest.approx(5.0)  # the drafter's cost borrowed from bucket 2


def test_a_warm_controller_weighs_each_batch_bucket_by_what_its_statistics_saw_there():
    """τ by batch bucket and node budget survives the statistics file: a drafter that gained 4 tokens a
    step at batch 1 and 1 at batch 8 is not warm-started at one τ for both."""
    c = _controller(LOOKUP_3_TO_6)
    for batch_size, accepted in ((1, 4), (8, 1)):
        c.start_batch({LOOKUP: LOOKUP_3_TO_6}, batch_size)
        c.observe(StepRecord(AUTOREGRESSIVE, batch_size, 0.01, [0] * batch_size, [0] * batch_size))
        for _ in range(8):
            c.observe(StepRecord(LOOKUP, batch_size, 0.012, [4] * batch_size, [accepted] * batch_size))
    warm = _warm(c.learned())
    assert c._tau(LOOKUP, 1) > c._tau(LOOKUP, 8) + 0.5
    for b in (1, 8):
        assert warm._tau(LOOKUP, b) == pytest.approx(c._tau(LOOKUP, b))


def test_a_warm_tree_drafter_keeps_its_tau_by_node_budget():
    """A tree drafter's τ by node budget (what sizes its trees) survives the statistics file."""
    trees = DraftLimits(4, 16, trees=True)
    c = _controller(trees)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.01, [0, 0], [0, 0]))
    for _ in range(4):
        c.observe(StepRecord(LOOKUP, 2, 0.012, [16, 16], [3, 2]))
    warm = _warm(c.learned(), trees)
    assert warm.tree_tau == c.tree_tau and warm.tree_tau[LOOKUP]
    assert warm.learned().tree_tau == c.learned().tree_tau


def test_learned_draft_sizes_stay_within_the_next_jobs_limits():
    c = _warm(_learned_controller(0.015).learned(), DraftLimits(4, 4, start_depth=2))
    assert c.draft_size(LOOKUP) == (4, 4)


# -- what a token costs: the cost model in the controller's choices ---------------------------------


def _forward_ms(batch_size: int, width: int) -> float:
    """A scripted forward: 1 ms while latency-bound, then 0.25 ms per token of the batch (compute-bound
    from 4 tokens on): drafting is nearly free at batch 1 and can only lose from batch 4 on."""
    return max(1.0, 0.25 * batch_size * width)


HOST_MS = {"lookup": 0.01, "heads": 0.02, "tree": 0.04}  # per row: drafting, acceptance, bookkeeping
SCRIPTED = {"lookup": DraftLimits(4, 4), "heads": DraftLimits(8, 8), "tree": DraftLimits(6, 16, trees=True)}


def _table_best_case(drafter: str, batch_size: int) -> float:
    """The speed-up of `drafter` at `batch_size` under the scripted table if every token were accepted."""
    plain = _forward_ms(batch_size, 1)
    return max(
        (1 + k) * plain / (_forward_ms(batch_size, 1 + k) + HOST_MS[drafter] * batch_size)
        for k in range(1, SCRIPTED[drafter].max_depth + 1)
    )


def _kept(forward_ms: dict[tuple[int, int], float]) -> dict[tuple[int, int], tuple[list[float], int]]:
    """Forward times in ms per batch by (batch size, width) as a controller keeps them (`Learned.forward_time`)."""
    costs = ForwardCosts()
    for (b, width), ms in sorted(forward_ms.items()):  # plain forwards first at each batch size
        for _ in range(FORWARD_SAMPLES):  # a width enters the cost model from its FORWARD_SAMPLES-th sample
            costs.observe(b, width, ms / 1000 / b)
    return {key: (list(t.recent), t.count) for key, t in costs.times.items()}


def _run_scripted(
    c: AdaptiveController,
    schedule: list[int],
    forward_ms: Callable[[int, int], float] = _forward_ms,
    host_ms: dict[str, float] = HOST_MS,
) -> list[tuple[str, int]]:
    """Steps under a scripted table (by default the one above; drafters `SCRIPTED`, host times per row
    `host_ms`) with drafts always accepted whole; (drafter, batch size) planned."""
    planned = []
    for batch_size in schedule:
        if len(c.rows) != batch_size:
            c.start_batch(SCRIPTED, batch_size)
        plan = c.plan(batch_size)
        planned.append((plan.drafter, batch_size))
        drafted = 0 if plan.drafter == AUTOREGRESSIVE else plan.nodes
        accepted = min(plan.depth, drafted)
        forward = forward_ms(batch_size, 1 + drafted) / 1000
        host = host_ms.get(plan.drafter, 0.0) * batch_size / 1000
        rows = [drafted] * batch_size
        c.observe(
            StepRecord(plan.drafter, batch_size, forward + host, rows, [accepted] * batch_size, 1 + drafted, forward)
        )
    return planned


def test_with_a_scripted_cost_table_no_drafter_whose_best_case_loses_is_planned():
    """Warm from an earlier job's forward times (as `controller_stats` gives them), the controller knows
    what a forward costs at every batch size; its drafters' host times it measures itself."""
    earlier = Learned(
        forward_time=_kept({(b, w): _forward_ms(b, w) for b in (1, 2, 4, 8, 16, 32) for w in (1, 2, 3, 5, 9, 17)})
    )
    c = AdaptiveController()
    c.warm_start(earlier)
    schedule = [1] * 200 + [8] * 60 + [2] * 100 + [32] * 40 + [4] * 40 + [1] * 50
    planned = _run_scripted(c, schedule)
    drafting = [(d, b) for d, b in planned if d != AUTOREGRESSIVE]
    assert all(_table_best_case(d, b) > 1.05 for d, b in drafting)
    assert {b for _, b in drafting} == {1, 2}  # where drafting pays, it drafts
    told = {(e["from"], e["batch_bucket"]) for e in c.drain_events() if e["scope"] == "explore"}
    assert told == {(d, b) for d in SCRIPTED for b in (4, 8, 32)}  # where it cannot, it says so, once


def test_a_cold_controller_explores_within_its_budget_and_cheapest_first():
    """Cold at batch 32, where every drafter loses (issue 26: seven drafters explored for two steps each
    over 32 rows cost more than the job's plain decoding), then at batch 1, where they pay."""
    c = AdaptiveController()
    planned, worst = [], 0.0
    for batch_size in [32] * 300 + [1] * 400:
        planned += _run_scripted(c, [batch_size])
        worst = max(worst, c.exploring_lost_s / c.decode_s)
    # Exploring never took over 3% of the time so far (a first step's unknown host time aside: 1% of it).
    assert worst <= c.settings.explore_budget * 1.01
    at_32 = [d for d, b in planned if d != AUTOREGRESSIVE and b == 32]
    # FORWARD_SAMPLES steps (the cheapest drafter's, each after some 160 plain steps) teach the model
    # what a wider forward costs at 32; no drafter's best case wins there after them.
    assert at_32 == ["lookup"] * FORWARD_SAMPLES
    assert {d for d, b in planned if b == 1} == {AUTOREGRESSIVE, *SCRIPTED}  # at batch 1, all explored


def test_exploring_steps_that_pay_for_themselves_leave_the_budget_to_the_next_drafter():
    """Cold at batch 1 under the scripted table, where a forward costs 1 ms up to 4 tokens and drafts are
    accepted whole. The first exploring step, 5 wide where only plain steps ran, is priced as 5 plain
    steps' time and may lose all but the one that emits its row's own token: it fits 3% of the decode
    time after 4 / 0.03 − 5 = 128.3 ms of plain steps, the 2 measured first and 127 more. It then pays
    (it emits more tokens than plain steps would in its time), so it costs the budget nothing, and
    neither do the next: every drafter is explored back to back. Counted at their whole time, paid or
    not, each exploring step of some 1.3 ms waited some 40 plain steps more: a cold job at batch 1 ran
    mostly plain steps until it had explored one drafter."""
    c = AdaptiveController()
    planned = [d for d, _ in _run_scripted(c, [1] * 250)]
    assert planned[:129] == [AUTOREGRESSIVE] * 129
    assert planned[129:145] == ["lookup"] * 8 + ["heads"] * 8 and "tree" in planned[145:]
    assert c.exploring_lost_s == 0.0


def test_a_cold_controller_told_what_forwards_cost_explores_as_soon_as_its_budget_allows_that_width():
    """As above, but told before the first batch what forwards 1, 2, 4, 8 and 16 tokens wide cost at batch 1
    (an actor times them at its start): the first exploring step, 5 wide, is priced at the 1.25 ms the
    table gives between 4 and 8 tokens, not at five plain steps; it may lose 0.25 ms, all but its plain
    step's worth, and fits 3% of the decode time after 0.25 / 0.03 − 1.25 = 7.1 ms of plain steps: the
    2 measured first and 6 more (untold: 129). It pays
    and is kept; the others are explored as the budget allows, and no time is lost exploring."""
    c = AdaptiveController()
    c.time_forwards(1, {w: [_forward_ms(1, w) / 1000] * FORWARD_SAMPLES for w in (1, 2, 4, 8, 16)})
    planned = [d for d, _ in _run_scripted(c, [1] * 300)]
    assert planned[:8] == [AUTOREGRESSIVE] * 8 and planned[8] == "lookup"
    assert set(planned) == {AUTOREGRESSIVE, *SCRIPTED}
    assert c.exploring_lost_s == 0.0


def test_starting_a_drafter_to_explore_it_counts_against_the_budget_but_not_in_its_step_time():
    """A draft model's prefill of the batch, when a step starts it, is paid by the exploring step:
    the decode time and the exploring budget count it, the drafter's estimate does not."""
    c = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1, time_window=1))
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    assert c.plan(2).drafter == LOOKUP  # the budget allows the first exploring step at once
    c.observe(StepRecord(LOOKUP, 2, 0.010, [4, 4], [4, 4], setup_s=0.1))  # paid: 5 tokens a plain step
    assert c.decode_s == pytest.approx(0.12) and c.exploring_lost_s == pytest.approx(0.1)
    assert c.speedup(LOOKUP, 2) == pytest.approx(5.0)


def test_an_exploring_step_loses_what_plain_steps_moving_the_batch_end_as_far_would_not():
    """Two of four rows took 5 tokens, two took 1: the batch still ends with the slow pair, so the step
    counts as one plain step's worth (its slower half's gain, as τ counts it), not three."""
    c = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1, time_window=1))
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=4)
    c.observe(StepRecord(AUTOREGRESSIVE, 4, 0.010, [0] * 4, [0] * 4))
    assert c.plan(4).drafter == LOOKUP
    c.observe(StepRecord(LOOKUP, 4, 0.020, [4] * 4, [4, 4, 0, 0]))  # two plain steps' time
    assert c.exploring_lost_s == pytest.approx(0.010)
    assert c.speedup(LOOKUP, 4) == pytest.approx(0.5)


def test_a_drafter_hopeless_after_its_first_exploring_steps_is_not_explored_further_unless_it_learns():
    """At batch 1 exploring asks for 8 row steps; a drafter at a third of plain speed after two, raised
    by its spread (0.8 / √2), still reads 0.52x: the rest could not make it the choice. One that learns
    from every row (a cold trie) is explored in full."""
    explored = {}
    for learns in (False, True):
        settings = ControllerSettings(explore_steps=2, explore_rows=8, explore_budget=1.0, probe_every=1000)
        c = AdaptiveController(dataclasses.replace(settings, max_probe_wait=1000))
        c.start_batch({LOOKUP: DraftLimits(4, 4, learns=learns)}, 1)
        steps = 0
        for _ in range(40):
            if c.plan(1).drafter == AUTOREGRESSIVE:
                c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.01, [0], [0]))
            else:
                steps += 1
                c.observe(StepRecord(LOOKUP, 1, 0.03, [4], [0]))  # one token in three plain steps' time
        explored[learns] = steps
    assert explored == {False: 2, True: 8}


def test_drain_exploring_gives_the_seconds_since_the_last_drain_of_exploring_losing_and_all_steps():
    """A job's records add these up: every exploring step's time, those that lost, and all steps'."""
    c = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1, time_window=1))
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=2)
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))
    assert c.plan(2).drafter == LOOKUP
    c.observe(StepRecord(LOOKUP, 2, 0.030, [4, 4], [0, 0], setup_s=0.1))  # 1 token a row in 3 plain steps: 2 lost
    assert c.drain_exploring() == pytest.approx({"exploring_s": 0.13, "exploring_lost_s": 0.12, "decoding_s": 0.14})
    c.observe(StepRecord(AUTOREGRESSIVE, 2, 0.010, [0, 0], [0, 0]))  # not exploring
    assert c.drain_exploring() == pytest.approx({"exploring_s": 0.0, "exploring_lost_s": 0.0, "decoding_s": 0.01})
    assert c.drain_exploring() == {"exploring_s": 0.0, "exploring_lost_s": 0.0, "decoding_s": 0.0}


def _planned_at_batch_1(
    c: AdaptiveController, steps: int, drafted: Callable[[Plan, list[str]], StepRecord]
) -> list[str]:
    """`steps` plans at batch 1: a plain one observed as a 2 ms step, a drafter's as `drafted(plan, the
    drafters planned so far)` records it; the drafters planned, in order."""
    planned = []
    for _ in range(steps):
        plan = c.plan(1)
        planned.append(plan.drafter)
        plain = StepRecord(AUTOREGRESSIVE, 1, 0.002, [0], [0], 1, 0.002)
        c.observe(plain if plan.drafter == AUTOREGRESSIVE else drafted(plan, planned))
    return planned


def test_a_first_step_that_pays_for_one_time_work_does_not_rule_a_drafter_out_before_it_is_explored():
    """Batch 1, plain steps and 1-wide forwards of 2 ms, a 5-wide forward of 2.5 ms. A chain drafter's
    first step spends 20 ms besides its forward (Lookahead counting a prompt): on that step alone its
    best case (5 tokens for 22.5 ms) loses, but the forward alone lets it pay (5 tokens for 2.5 ms),
    so it is explored to `explore_rows` row steps; at 0.2 ms of host time a step after that, it pays
    and is chosen. With `explore_rows` of 1 its first step is all its exploration, and it is ruled out."""

    def run(settings: ControllerSettings) -> list[str]:
        c = AdaptiveController(settings)
        c.warm_start(
            Learned(row_time={(AUTOREGRESSIVE, 1): ([0.002], 9)}, forward_time=_kept({(1, 1): 2.0, (1, 5): 2.5}))
        )
        c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=1)

        def step(plan: Plan, planned: list[str]) -> StepRecord:
            host = 0.020 if planned.count(LOOKUP) == 1 else 0.0002
            return StepRecord(LOOKUP, 1, 0.0025 + host, [4], [4], 5, 0.0025)

        return _planned_at_batch_1(c, 60, step)

    explored = run(ControllerSettings(explore_budget=1.0))
    assert explored[:8] == [LOOKUP] * 8 and explored[-10:] == [LOOKUP] * 10
    assert run(ControllerSettings(explore_budget=1.0, explore_rows=1, explore_steps=1)).count(LOOKUP) == 1


def test_a_drafter_whose_exploration_has_begun_is_explored_before_a_narrower_one_cuts_in():
    """Cold at batch 1, plain steps of 2 ms. A 10-token chain's exploring steps lose (2.5 ms, nothing
    accepted: 0.8x, which raised by its spread might still pay, so it is not written off) and each
    waits for the budget to refill; a 2-token chain would fit the budget sooner. It
    waits all the same until the first is explored (`explore_steps` steps and `explore_rows` row
    steps): one drafter at a time, so that the first can be chosen as soon as its exploration ends."""
    c = AdaptiveController()
    c.start_batch({"wide": DraftLimits(10, 10), "narrow": DraftLimits(2, 2)}, batch_size=1)

    def step(plan: Plan, planned: list[str]) -> StepRecord:
        wall = 0.0025 if plan.drafter == "wide" else 0.0022
        return StepRecord(plan.drafter, 1, wall, [plan.depth], [0], 1 + plan.depth, wall)

    planned = _planned_at_batch_1(c, 3000, step)
    wide = [i for i, d in enumerate(planned) if d == "wide"]
    assert len(wide) >= c.settings.explore_rows and "narrow" in planned
    assert planned.index("narrow") > wide[c.settings.explore_rows - 1]


@pytest.mark.parametrize(("per_depth", "shortened"), [(True, True), (False, False)])
def test_a_chain_whose_drafting_runs_a_model_per_token_is_shortened_as_its_host_time_says(per_depth, shortened):
    """At batch 1 (forward 2.5 ms + 0.18 ms per extra token) a drafter whose drafting costs 0.5 ms plus
    0.9 ms per draft token (a draft model, EAGLE's head), and whose first two tokens are always accepted
    and the third never. Declared `per_depth`, its measured host time at 5 tokens is taken to shrink
    in proportion for shorter chains until measured there, and the chain moves down to 1 to 3 tokens;
    undeclared, a shorter chain is taken to cost as much besides the forward, and it stays at 5.
    Shortened, it does not stay there: at 2 tokens every draft is accepted, so acceptance per position
    reads 1.0 and the modelled depth is the longest again, where it reads 2/3 (the sizing swings between
    2 and 5 tokens, about half its drafting steps at each, in whatever phase the steps before left it)."""
    c = AdaptiveController(ControllerSettings(resize_rows=16))  # a step toward the best every 16 drafts
    limits = {"draft": DraftLimits(5, 5, per_depth=per_depth)}
    c.start_batch(limits, batch_size=1)
    depths = []
    for _ in range(1500):
        plan = c.plan(1)
        k = 0 if plan.drafter == AUTOREGRESSIVE else plan.depth
        forward = (2.5 + 0.18 * k) / 1000
        host = (0.5 + 0.9 * k) / 1000 if k else 0.0
        c.observe(StepRecord(plan.drafter, 1, forward + host, [k], [min(k, 2)], 1 + k, forward))
        depths.append(k)
    drafted = [k for k in depths[-400:] if k]
    short = sum(1 for k in drafted if k <= 3)
    assert drafted and (short >= len(drafted) / 3 if shortened else short == 0)


def test_a_drafter_measured_while_the_machine_was_loaded_keeps_its_best_case_once_it_is_quiet():
    """Its forward and host times are kept as ratios to a plain step when it ran: plain steps measured
    since, three times faster, do not make it look hopeless (then it would never run to be measured
    again). Best case: 5 tokens for a 5-wide forward of 1.25 plain steps and 0.25 of host work."""
    c = AdaptiveController()
    c.start_batch({LOOKUP: CHAIN_OF_4}, batch_size=1)

    def plain(seconds: float) -> StepRecord:
        return StepRecord(AUTOREGRESSIVE, 1, seconds, [0], [0], 1, seconds)

    for _ in range(9):
        c.observe(plain(0.006))  # loaded
    for _ in range(FORWARD_SAMPLES):
        c.observe(StepRecord(LOOKUP, 1, 0.009, [4], [4], 5, 0.0075))
    assert c.best_case(LOOKUP, 1) == pytest.approx(5 / 1.5)
    for _ in range(20):  # quiet: past the steps a best case is kept
        c.observe(plain(0.002))
    assert c.best_case(LOOKUP, 1) == pytest.approx(5 / 1.5)


def test_chains_are_sized_per_batch_by_tokens_per_second_on_literal_timings():
    """The issue's timings (see tests/test_cost_model.py for the hand computation): with α 0.6, a chain
    of 7 at batch 1 and of 2 at batch 8."""
    widths, batch_1, batch_8 = (1, 2, 4, 8, 16), (3.1, 3.5, 2.8, 3.0, 4.0), (4.0, 5.1, 6.8, 9.7, 13.9)
    forward = {(1, w): ms for w, ms in zip(widths, batch_1, strict=True)}
    forward |= {(8, w): ms for w, ms in zip(widths, batch_8, strict=True)}
    c = AdaptiveController(ControllerSettings(resize_rows=2))
    c.warm_start(Learned(forward_time=_kept(forward)))
    c.start_batch({LOOKUP: DraftLimits(8, 8)}, batch_size=2)
    assert c.draft_size(LOOKUP, 8) == (8, 8)  # acceptance not yet measured: as learned
    c.observe(StepRecord(LOOKUP, 2, 0.007, [8, 8], [3, 0]))  # 3 accepted, 2 rejections: α 0.6
    assert c.draft_size(LOOKUP, 1) == (7, 7) and c.draft_size(LOOKUP, 8) == (2, 2)


def test_a_drafter_that_sizes_its_own_drafts_is_asked_for_its_longest_and_told_what_each_length_costs():
    """Batch 1: plain steps of 2 ms; forwards of 2.0, 2.4, 2.8 and 4.0 ms at widths 1, 2, 5 and 11. A
    step drafting k tokens is a forward 1 + k wide (its host time not measured yet), over a plain step:
    k = 1: 2.4 / 2 = 1.2; k = 2 and 3, a third and two thirds of the way to 2.8: 1.2667, 1.3333; k = 4:
    1.4; then 0.1 more per token up to k = 10: 2.0."""
    c = AdaptiveController(ControllerSettings(explore_budget=1.0))
    forwards = _kept({(1, 1): 2.0, (1, 2): 2.4, (1, 5): 2.8, (1, 11): 4.0})
    c.warm_start(Learned(row_time={(AUTOREGRESSIVE, 1): ([0.002], 9)}, forward_time=forwards))
    c.start_batch({LOOKUP: DraftLimits(10, 10, sizes_own=True)}, batch_size=1)
    plan = c.plan(1)
    assert (plan.drafter, plan.depth) == (LOOKUP, 10)
    expected = [1.2, 1.2667, 1.3333, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0]
    assert plan.step_costs == pytest.approx(expected, abs=1e-4)
    fixed = AdaptiveController(ControllerSettings(explore_budget=1.0))
    fixed.warm_start(Learned(row_time={(AUTOREGRESSIVE, 1): ([0.002], 9)}, forward_time=forwards))
    fixed.start_batch({LOOKUP: DraftLimits(10, 10, start_depth=3)}, batch_size=1)
    assert (fixed.plan(1).depth, fixed.plan(1).step_costs) == (3, None)  # sized by the controller


def test_a_drafting_choice_stands_replan_rows_row_steps_before_the_options_are_weighed_again():
    c = _controller(smoothing=1.0, time_window=1, replan_rows=8)  # at batch 2: four steps
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    _step(c, LOOKUP, 0.010, [1, 1])
    planned = []
    for _ in range(4):
        planned.append(c.plan(2).drafter)
        c.observe(StepRecord(LOOKUP, 2, 0.013, [4, 4], [0, 0]))  # 0.77 each: it would be switched off at once
    assert planned == [LOOKUP] * 4
    assert c.plan(2).drafter == AUTOREGRESSIVE  # weighed again
    c = _controller(smoothing=1.0, time_window=1, replan_rows=8)
    _step(c, AUTOREGRESSIVE, 0.010, [0, 0], drafted=(0, 0))
    _step(c, LOOKUP, 0.010, [1, 1])
    assert c.plan(2).drafter == LOOKUP
    c.observe(StepRecord(LOOKUP, 2, 0.013, [4, 4], [0, 0]))
    c.keep_rows([0])  # a row finished: the batch changed, every option is weighed again
    assert c.plan(1).drafter == AUTOREGRESSIVE


def test_a_self_sizing_drafter_is_told_depths_beyond_the_widest_forward_measured_cost_what_that_one_does():
    """Batch 1: plain steps of 2 ms, forwards of 2.0 and 2.6 ms at widths 1 and 3 only. Extrapolated on
    that slope a 10-token draft would cost 4.4 ms (2.2 plain steps) and never be tried; told the
    widest measured forward's cost instead, 1.3, it may draft that deep once and have it measured.
    Once width 11 is measured (4.0 ms, `FORWARD_SAMPLES` times), the costs are recomputed at once: 2.0
    for k = 10."""
    c = AdaptiveController(ControllerSettings(explore_budget=1.0))
    c.warm_start(Learned(row_time={(AUTOREGRESSIVE, 1): ([0.002], 9)}, forward_time=_kept({(1, 1): 2.0, (1, 3): 2.6})))
    c.start_batch({LOOKUP: DraftLimits(10, 10, sizes_own=True)}, batch_size=1)
    assert c.plan(1).step_costs == pytest.approx([1.15] + [1.3] * 9)
    for _ in range(FORWARD_SAMPLES):
        c.observe(StepRecord(LOOKUP, 1, 0.004, [10], [10], width=11, forward_s=0.004))
    assert c.plan(1).step_costs[-1] == pytest.approx(2.0)


def test_a_ragged_forward_is_priced_at_the_width_of_the_full_grid_computing_as_many_slots():
    """Batch 8, forwards of 2.0 ms at width 1 and 3.0 at width 2. A step 6 wide whose matmuls computed
    16 slots (`computed_width` 2) measures the forward at width 2, not 6: timed at 2.4 ms four times,
    width 2 then costs the median of its seven samples (3.0 x 3, 2.4 x 4: 2.4) and width 6 is unmeasured."""
    c = AdaptiveController(ControllerSettings(explore_budget=1.0))
    c.warm_start(Learned(row_time={(AUTOREGRESSIVE, 8): ([0.002], 9)}, forward_time=_kept({(8, 1): 2.0, (8, 2): 3.0})))
    c.start_batch({LOOKUP: DraftLimits(5, 5, sizes_own=True)}, batch_size=8)
    for _ in range(4):
        drafted = [5, 1, 1, 1, 0, 0, 0, 0]
        c.observe(StepRecord(LOOKUP, 8, 0.004, drafted, [0] * 8, 6, 8 * 0.0024, computed_width=2))
    assert c.forward.widths(8) == [1, 2]
    assert c.forward.row_seconds(8, 2) == pytest.approx(0.0024)


def test_drafting_costs_are_weighed_against_the_plain_forward_of_now_not_the_plain_steps_of_earlier_prompts():
    """Plain steps of 3 ms, taken over earlier (longer) prompts; the forward now 2.0 ms at width 1 and
    2.4 at width 2: a step drafting one token costs 1.2 plain steps of now, not 2.4 / 3 = 0.8, which
    would let any draft pay."""
    c = AdaptiveController(ControllerSettings(explore_budget=1.0))
    forwards = _kept({(1, 1): 2.0, (1, 2): 2.4, (1, 5): 2.8, (1, 11): 4.0})
    c.warm_start(Learned(row_time={(AUTOREGRESSIVE, 1): ([0.003], 9)}, forward_time=forwards))
    c.start_batch({LOOKUP: DraftLimits(10, 10, sizes_own=True)}, batch_size=1)
    assert c.plan(1).step_costs[:2] == pytest.approx([1.2, 1.2667], abs=1e-4)
    assert c.best_case(LOOKUP, 1) == pytest.approx(11 * 2.0 / 4.0)  # 11 tokens for a forward of 11 over one of 1


def test_a_tree_budget_measured_while_its_drafter_was_cold_is_asked_for_again():
    """Batch 1, forwards of 2.5, 2.6 and 2.8 ms at widths 1, 5 and 9. A tree drafter's first 100 steps,
    at 8 nodes, accept nothing (a Lookahead trie that has seen nothing); 4 nodes then run 2,000 steps at
    τ 2.5. Kept whole, the cold 1.0 would hold 8 nodes at (100 x 1.0 + 64 x 3.25) / 164 = 1.88 by what
    4 says of them (`tree_tau_by_budget`): 1.88 / 2.8 against 2.5 / 2.6, never again. Halved every 512
    row steps at the other budget, those 100 count as 6.7: 3.04 / 2.8 beats 2.5 / 2.6, and 8 nodes
    are asked for; measured anew at τ 3.0 they stay."""
    c = AdaptiveController()
    c.warm_start(
        Learned(
            row_time={(AUTOREGRESSIVE, 1): ([0.0025], 9)},
            forward_time=_kept({(1, 1): 2.5, (1, 5): 2.6, (1, 9): 2.8}),
        )
    )
    c.start_batch({"tree": DraftLimits(6, 8, trees=True)}, batch_size=1)
    assert c.draft_size("tree", 1) == (6, 8)  # a tree starts with its whole node budget
    for _ in range(100):
        c.observe(StepRecord("tree", 1, 0.0028, [8], [0], width=9))
    assert c.draft_size("tree", 1) == (6, 4)
    for i in range(2000):
        c.observe(StepRecord("tree", 1, 0.0026, [4], [1 + i % 2], width=5))
    assert c.draft_size("tree", 1) == (6, 8)
    for _ in range(64):
        c.observe(StepRecord("tree", 1, 0.0028, [8], [2], width=9))
    assert c.draft_size("tree", 1) == (6, 8)


@pytest.mark.parametrize("learns", [True, False])
def test_a_drafter_that_learns_while_idle_is_asked_again_as_its_estimate_ages(learns):
    """Batch 1: a drafter explored on 64 row steps at 0.83x (a cold Lookahead trie) beside one at 1.5x
    on 500. Asked again, it runs at 2.08x: its trie learned from what the other emitted. If it learns
    from every row (`DraftLimits.learns`) the row steps behind its estimate halve every 512 row steps
    decoded without it, so it is probed and put on trial sooner, and its fresh steps move its estimate
    faster; it is chosen within 1,000 steps. Unaged, its probes move an estimate resting on 64 row steps
    a step at a time, and it is not."""
    trie = "trie"
    c = AdaptiveController(ControllerSettings(explore_steps=1, explore_rows=1))
    c.start_batch({LOOKUP: CHAIN_OF_4, trie: DraftLimits(4, 4, learns=learns)}, batch_size=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
    for _ in range(64):
        c.observe(StepRecord(trie, 1, 0.012, [4], [0]))  # 1 token in 1.2 plain steps' time: 0.83x
    for _ in range(512):
        c.observe(StepRecord(LOOKUP, 1, 0.020, [4], [2]))  # 3 tokens in two plain steps' time: 1.5x
    assert c._evidence(trie) == pytest.approx(32 if learns else 64)
    c.current = LOOKUP
    seconds = {AUTOREGRESSIVE: 0.010, LOOKUP: 0.020, trie: 0.012}
    for step in range(1000):
        drafter = c.plan(1).drafter
        drafted, accepted = {AUTOREGRESSIVE: (0, 0), LOOKUP: (4, 2), trie: (4, 1 + step % 2)}[drafter]
        c.observe(StepRecord(drafter, 1, seconds[drafter], [drafted], [accepted]))  # trie: 2.5 tokens, 2.08x
    assert (c.current == trie) == learns


def test_a_drafter_whose_step_just_now_switches_to_it_is_chosen_before_another_is_probed():
    """Batch 1, beside LOOKUP at 1.33x on 500 row steps: `la` at 2.5x on 28 (weighed 1.46, over 1.33 · 1.05)
    and `jac` at 1.0x on 2, on trial (weighed at its spread above, 1.57). A switch needs a step of `la`
    just now; if `jac`'s trial step came first, `la` would wait for its next probe again."""
    settings = ControllerSettings(
        explore_steps=1, explore_rows=1, probe_every=10**6, max_probe_wait=10**6, smoothing=1.0, time_window=1
    )
    c = AdaptiveController(settings)
    c.start_batch({LOOKUP: CHAIN_OF_4, "la": CHAIN_OF_4, "jac": CHAIN_OF_4}, batch_size=1)
    c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.010, [0], [0]))
    for _ in range(2):
        c.observe(StepRecord("jac", 1, 0.020, [4], [1]))  # 2 tokens in two plain steps' time: 1.0x
    for _ in range(500):
        c.observe(StepRecord(LOOKUP, 1, 0.015, [4], [1]))  # 2 tokens in 1.5 plain steps' time: 1.33x
    c.current = LOOKUP
    for _ in range(28):
        c.observe(StepRecord("la", 1, 0.012, [4], [2]))  # 3 tokens in 1.2 plain steps' time: 2.5x
    assert c.plan(1).drafter == "la" and c.current == "la"

"""The controller's estimates per batch bucket and draft size, and exploration priced at the width used."""

from __future__ import annotations

import pytest
from test_controller import SCRIPTED, _kept, _run_scripted

from strategies.control.controller import AdaptiveController, ControllerSettings, Learned
from strategies.control.state import Ema
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord


def test_exploring_a_17_wide_drafter_waits_what_the_cost_model_says_not_a_multiple_of_16_wide_forwards():
    """Batch 1, plain steps of 2.5 ms and a 16-wide forward of 4.4 ms known; a tree of 16 nodes, never
    run, asks for a 17-wide step. The model extends the 1-to-16 slope (0.1267 ms per token): 4.527 ms, and
    10% on top for the guess, 4.979 ms. It may lose all of it but a plain step, 2.479 ms: exploring it fits
    3% of the decode time once (2.479 / 0.03 − 4.979) / 2.5 = 31.1 plain steps have run: 32. As two 16-wide
    forwards side by side (8.8 ms) it waited 81."""
    c = AdaptiveController()
    c.warm_start(
        Learned(row_time={(AUTOREGRESSIVE, 1): ([0.0025], 9)}, forward_time=_kept({(1, 1): 2.5, (1, 16): 4.4}))
    )
    c.start_batch({"tree": DraftLimits(6, 16, trees=True)}, batch_size=1)
    plan = c.plan(1)
    assert (plan.drafter, plan.steps) == (AUTOREGRESSIVE, 32)


def test_a_learning_drafter_is_explored_at_the_width_it_has_drafted_not_its_budget():
    """A cold trie with a 16-node budget has drafted 1-node trees: its next exploring step is priced 2 wide."""
    c = AdaptiveController(ControllerSettings(explore_steps=3, explore_rows=3))
    c.warm_start(Learned(forward_time=_kept({(1, 1): 2.5, (1, 2): 2.6, (1, 16): 4.4})))
    c.start_batch({"trie": DraftLimits(6, 16, trees=True, learns=True)}, batch_size=1)
    for _ in range(2):
        c.observe(StepRecord(AUTOREGRESSIVE, 1, 0.0025, [0], [0], 1, 0.0025))
    c.observe(StepRecord("trie", 1, 0.0026, [1], [0], 2, 0.0026))
    assert c._explore_width("trie", 1) == 2


def test_a_drafter_excluded_at_one_bucket_is_probed_again():
    """Measured at batch 1 only with a host time that, borrowed at batch 8, makes every draft lose there:
    it is left out at 8 (said once), and probed there again `max_probe_wait` steps after it last ran."""
    c = AdaptiveController(ControllerSettings(max_probe_wait=150))
    forwards = {(b, w): max(1.0, 0.25 * b * w) for b in (1, 8) for w in (1, 2, 3, 5, 9, 17)}
    c.warm_start(Learned(forward_time=_kept(forwards)))
    host_ms = {"lookup": 2.0}  # per row: dear beside a 1 ms forward at batch 1, hopeless at batch 8
    limits = {"lookup": SCRIPTED["lookup"]}
    planned = []
    for batch_size in [1] * 100 + [8] * 400:
        if len(c.rows) != batch_size:
            c.start_batch(limits, batch_size)
        planned += _run_scripted(c, [batch_size], host_ms=host_ms)
    at_8 = [i for i, (d, b) in enumerate(planned) if b == 8 and d == "lookup"]
    told = [e for e in c.drain_events() if e["scope"] == "explore" and e["batch_bucket"] == 8]
    assert len(told) == 1
    assert at_8 and at_8[0] - max(i for i, (d, b) in enumerate(planned) if b == 1 and d == "lookup") > 150


# -- a scripted cost table and scripted acceptance, per batch bucket --------------------------------

BUCKET_DRAFTERS = {"lookup": DraftLimits(6, 6), "heads": DraftLimits(4, 4)}
BUCKET_HOST_MS = {"lookup": 0.01, "heads": 0.02}  # per row


def _bucket_forward_ms(batch_size: int, width: int) -> float:
    """1 ms at batch 1 whatever the width; at batch 8, 1 ms up to 3 tokens and 3 ms from 4 on (a kernel's
    tile boundary): beyond two draft tokens a step triples."""
    return 1.0 if batch_size == 1 or width <= 3 else 3.0


def _bucket_accepts(drafter: str, batch_size: int, drafted: int) -> int:
    """Prompt lookup copies batch 1's prompt whole and finds nothing in batch 8's; the heads' drafts are
    always accepted."""
    return 0 if (drafter, batch_size) == ("lookup", 8) else drafted


def _hand_pick(batch_size: int) -> tuple[str, int]:
    """The drafter and draft length with the most tokens per second: τ(k) = 1 + accepted of k, over the
    step's time, the forward at width 1 + k and the drafter's host time."""
    rates = {}
    for drafter, limits in BUCKET_DRAFTERS.items():
        for k in range(1, limits.max_depth + 1):
            step_ms = _bucket_forward_ms(batch_size, 1 + k) + BUCKET_HOST_MS[drafter] * batch_size
            rates[(drafter, k)] = (1 + _bucket_accepts(drafter, batch_size, k)) / step_ms
    return max(rates, key=lambda pick: (rates[pick], -pick[1]))


def test_on_a_scripted_cost_table_and_acceptance_the_controller_plans_what_a_hand_computation_picks():
    """By hand: at batch 1 prompt lookup, 6 tokens (7 tokens per 1.01 ms); at batch 8 the heads, 2
    tokens (3 per 1.16 ms; 4 cost 3.16). Drafting at batch 8 after batch 1, one τ per drafter weighed
    lookup there on what it gained at batch 1; back at batch 1, on what it lost at batch 8."""
    assert _hand_pick(1) == ("lookup", 6) and _hand_pick(8) == ("heads", 2)
    widths = (1, 2, 3, 4, 5, 7)
    c = AdaptiveController()
    c.warm_start(Learned(forward_time=_kept({(b, w): _bucket_forward_ms(b, w) for b in (1, 8) for w in widths})))
    picks = []
    for batch_size in [1] * 300 + [8] * 300 + [1] * 300:
        if len(c.rows) != batch_size:
            c.start_batch(BUCKET_DRAFTERS, batch_size)
        plan = c.plan(batch_size)
        drafted = 0 if plan.drafter == AUTOREGRESSIVE else plan.nodes
        accepted = _bucket_accepts(plan.drafter, batch_size, drafted)
        forward = _bucket_forward_ms(batch_size, 1 + drafted) / 1000
        host = BUCKET_HOST_MS.get(plan.drafter, 0.0) * batch_size / 1000
        rows = [drafted] * batch_size
        c.observe(
            StepRecord(plan.drafter, batch_size, forward + host, rows, [accepted] * batch_size, 1 + drafted, forward)
        )
        picks.append((plan.drafter, plan.nodes))
    for phase, batch_size in enumerate((1, 8, 1)):
        settled = picks[phase * 300 + 200 : phase * 300 + 300]
        assert settled.count(_hand_pick(batch_size)) >= 90, (batch_size, settled)


# -- configured sizes are bounds the cost model chooses within ---------------------------------------


def _tree_at_4_nodes(forward_ms: dict[int, float]) -> AdaptiveController:
    """Batch 1, forwards timed at `forward_ms` (width -> ms); a tree drafter configured for 16 nodes, learned
    down to 4 (an earlier job's, or at another batch size), then 20 steps at 4 nodes gaining 3 tokens each:
    fewer than its learned budget moves on (`resize_rows`)."""
    c = AdaptiveController()
    c.warm_start(
        Learned(
            row_time={(AUTOREGRESSIVE, 1): ([forward_ms[1] / 1000], 9)},
            forward_time=_kept({(1, w): ms for w, ms in forward_ms.items()}),
            nodes={"tree": 4},
        )
    )
    c.start_batch({"tree": DraftLimits(6, 16, trees=True)}, batch_size=1)
    assert c.nodes["tree"] == 4
    for _ in range(20):
        c.observe(StepRecord("tree", 1, forward_ms[5] / 1000, [4], [2], width=5))
    return c


def test_a_tree_grows_to_its_configured_budget_where_verification_is_flat_and_not_where_it_is_not():
    """Flat to 17 tokens: τ 3 at 4 nodes says 1 + 2·(1 + 16/4)/2 = 6 at 16 nodes, for the same step time: the
    configured 16. Where a forward costs a plain step per token from 5 on, 4 nodes stay."""
    flat = _tree_at_4_nodes({1: 2.5, 5: 2.5, 9: 2.5, 17: 2.5})
    assert flat.draft_size("tree", 1) == (6, 16)
    steep = _tree_at_4_nodes({1: 2.5, 5: 2.6, 9: 22.5, 17: 42.5})
    assert steep.draft_size("tree", 1) == (6, 4)


def test_tau_at_a_bucket_and_size_leans_on_the_bucket_and_the_drafter_by_the_row_steps_behind_each():
    """τ 3 over everything; at batch 8, 2.0 over 32 row steps at 4 nodes and 1.5 over 16 at 2 nodes (an
    `Ema`'s `seen` counts 64-row shares). The bucket's mean, 1.833 over 48 row steps, shrunk toward 3 by
    64: (1.833·48 + 3·64) / 112 = 2.5; at the planned 4 nodes, 2.0 over 32 shrunk toward that:
    (2·32 + 2.5·64) / 96 = 2.333."""
    c = AdaptiveController()
    c.start_batch({"x": DraftLimits(4, 4)}, batch_size=8)
    c.tau["x"] = Ema(3.0, 10.0)
    c.tau_at["x"] = {(1, 4): Ema(4.0, 1.0), (8, 4): Ema(2.0, 0.5), (8, 2): Ema(1.5, 0.25)}
    assert c._tau("x", 8) == pytest.approx(7 / 3)
    assert c._tau("x", 2) == pytest.approx(3.0)  # nothing at batch 2: the drafter's τ

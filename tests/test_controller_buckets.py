"""The controller's estimates per batch bucket and draft size, and exploration priced at the width used."""

from __future__ import annotations

from test_controller import SCRIPTED, _kept, _run_scripted

from strategies.control.controller import AdaptiveController, ControllerSettings, Learned
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

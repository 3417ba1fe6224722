"""What the controller answers a strategy besides its plans (`strategies/control/controller.py`): the sizes a
batch starts from, whether a learning drafter is fed a batch, and the event of a drafter that failed; each
test names the mutants it kills."""

from __future__ import annotations

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A = "a"


class SpeedupsByBucket(AdaptiveController):
    """A controller whose speed-up estimates are a literal table by (drafter, batch bucket)."""

    def __init__(self, speedups: dict[tuple[str, int], float]) -> None:
        super().__init__(ControllerSettings())
        self.speedups = speedups
        self.start_batch({A: DraftLimits(4, 4, learns=True)}, 3)

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get((drafter, b))


def test_a_learning_drafter_is_weighed_at_its_batchs_bucket():
    """Kills `worth_learning` asking for the estimate at no bucket, or at the batch size instead of its
    bucket."""
    c = SpeedupsByBucket({(A, 4): 0.5, (A, 3): 2.0})
    assert not c.worth_learning(A, 3)
    c.speedups[(A, 2)] = 2.0
    assert c.worth_learning(A, 2)


def test_a_failed_drafters_event_is_a_batch_event_at_its_step():
    """Kills `drafter_failed` telling its event with a scope other than "batch" (none, or another word)."""
    c = SpeedupsByBucket({})
    c.step = 7
    c.drafter_failed(A, "a raised")
    assert c.drain_events() == [{"scope": "batch", "from": A, "to": AUTOREGRESSIVE, "reason": "a raised", "step": 7}]


def test_a_batch_keeps_the_sizes_learned_below_its_drafters_limits():
    """Kills `start_batch` taking a drafter's start depth or a tree's node budget over what it learned
    below them (looked up under another name), or a chain's nodes other than its learned depth."""
    c = AdaptiveController(ControllerSettings())
    c.depth, c.nodes = {A: 3, "t": 2}, {"t": 4}
    c.start_batch({A: DraftLimits(6, 6, start_depth=5), "t": DraftLimits(4, 16, trees=True)}, 1)
    assert (c.depth, c.nodes) == ({A: 3, "t": 2}, {A: 3, "t": 4})

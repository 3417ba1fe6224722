"""When the controller explores and writes off a drafter (`strategies/control/exploration.py`) on
literal estimates and times; each test names the mutants it kills."""

from __future__ import annotations

from collections import deque

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.cost_model import FORWARD_SAMPLES, RecentTime
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A, B = "a", "b"


class LiteralEstimates(AdaptiveController):
    """A controller whose speed-up estimates are a literal table."""

    def __init__(self, speedups: dict[str, float | None], **settings) -> None:
        super().__init__(ControllerSettings(**settings))
        self.speedups = speedups

    def speedup(self, drafter: str, b: int) -> float | None:
        return 1.0 if drafter == AUTOREGRESSIVE else self.speedups.get(drafter)


def _started(controller: AdaptiveController, batch_size: int = 1, **limits: DraftLimits) -> AdaptiveController:
    controller.start_batch(limits, batch_size)
    return controller


def _times(*values: float) -> RecentTime:
    return RecentTime(9, recent=deque(values), count=len(values))


def _linear_forwards(c: AdaptiveController, b: int, widths: range, plain: float = 0.01, slope: float = 0.5) -> None:
    """Forwards at bucket `b` costing plain (1 + slope (w - 1)) seconds per row, each timed enough to count,
    and plain steps run there."""
    c.row_time[(AUTOREGRESSIVE, b)] = _times(plain)
    for w in widths:
        for _ in range(FORWARD_SAMPLES):
            c.forward.observe(b, w, plain * (1 + slope * (w - 1)))


def test_a_drafter_is_written_off_only_below_the_current_choice_and_before_any_step_never():
    """Kills `_written_off` counting a drafter never measured as having run a step (with `explore_steps`
    1), failing on it, writing off a raised estimate equal to the current choice's (`<` as `<=`), or
    taking a current drafter without an estimate as 2.0 rather than plain steps' 1.0."""
    once = _started(LiteralEstimates({A: 0.5}, explore_steps=1), a=DraftLimits(4, 4))
    assert not once._written_off(A, 1)  # no step yet
    c = _started(LiteralEstimates({A: 1.25, B: 1.5}), a=DraftLimits(4, 4), b=DraftLimits(4, 4))
    c.measured[A] = (2, 16)  # raised 1.25 x (1 + 0.8 / 4) = 1.5
    c.current = B
    assert not c._written_off(A, 1)  # as good as the current choice: not below it
    c.speedups[B] = None
    assert not c._written_off(A, 1)  # 1.5 beats plain steps


def test_an_exploring_step_waits_until_what_it_may_lose_fits_the_explore_budget():
    """Kills `_explore_wait` pricing the step at other than the modelled size at its bucket (the learned
    4 nodes), without the drafter's host time, a start (`_resume_cost`) subtracted, taken at another
    drafter's or bucket's, or scaled other than by a plain step times the batch, the plain steps it
    loses against or the wait's plain steps other than per row times the batch. Bucket 2, batch 2:
    forwards 0.01 (1 + 0.5 (w - 1)) s per row, host 0.005 s; at α 0.8 three tokens pay best (E/t 0.984
    against 0.976 for two, 0.96 for four): width 4, 0.03 s per row, 0.06 s a step against 0.02 plain; a
    start of half a plain step: it may lose 0.04 + 0.01 s, 1.667 s of decoding at 3%, less its own
    0.06 s: 80.3, 81 plain steps of 0.02 s."""
    c = _started(AdaptiveController(ControllerSettings()), 2, a=DraftLimits(4, 4))
    _linear_forwards(c, 2, range(1, 6))
    c.alpha[(A, 2)] = 0.8
    c.host_time[(A, 2, 3)] = _times(0.5)
    c.resume_setup[(A, 2)] = deque([0.5])
    assert c.draft_size(A, 2) == (3, 3)
    assert c._explore_wait(A, 2, 2) == 81
    c.decode_s = 1.61
    assert c._explore_wait(A, 2, 2) == 0


def test_an_exploring_step_beyond_a_lone_plain_forward_is_priced_as_plain_forwards_side_by_side():
    """Kills `_explore_wait`'s bound, where the model has no slope, without the drafter's host time.
    A plain forward of 0.01 s alone: the 5-wide step is five of them, 0.05 s, and its host time 0.005 s:
    it may lose 0.045 s, 1.5 s of decoding at 3%, less its own 0.055 s: 145 plain steps."""
    c = _started(AdaptiveController(ControllerSettings()), a=DraftLimits(4, 4))
    _linear_forwards(c, 1, range(1, 2))
    c.host_time[(A, 1, 5)] = _times(0.5)
    assert c._explore_wait(A, 1, 1) == 145

"""Literal times for the controller's tests: a controller with one drafter, recent times, and forwards
whose cost grows linearly with their width."""

from __future__ import annotations

from collections import deque

from strategies.control.controller import AdaptiveController, ControllerSettings
from strategies.control.cost_model import FORWARD_SAMPLES, RecentTime
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits

A = "a"


def one_drafter(limits: DraftLimits, **settings) -> AdaptiveController:
    """A controller started on a batch of one row with drafter `A` under `limits`."""
    c = AdaptiveController(ControllerSettings(**settings))
    c.start_batch({A: limits}, 1)
    return c


def times(*values: float) -> RecentTime:
    """A recent time that has seen exactly `values`."""
    return RecentTime(9, recent=deque(values), count=len(values))


def linear_forwards(c: AdaptiveController, b: int, widths: range, plain: float = 0.01, slope: float = 0.5) -> None:
    """Forwards at bucket `b` costing plain (1 + slope (w - 1)) seconds per row, each timed enough to count,
    and plain steps run there."""
    c.row_time[(AUTOREGRESSIVE, b)] = times(plain)
    for w in widths:
        for _ in range(FORWARD_SAMPLES):
            c.forward.observe(b, w, plain * (1 + slope * (w - 1)))

"""What a step of a drafter costs, by the cost model (`cost_model.py`), at a batch bucket.

Each step reports its forward's width (new tokens per row, 1 + the widest draft) and time, so the
controller keeps the target's forward time per row by bucket and width, and each drafter's host time
(step − forward: drafting, acceptance, bookkeeping) per bucket and width. At a bucket where plain steps
ran but a drafter has not, the drafter's step costs the forward at its width there plus its host time
from the nearest bucket, not another bucket's step ratio: a draft nearly free at batch 1 may cost
several plain steps at batch 8. A step so modelled is weighed against a plain step modelled alike, the
forward at width 1 now (`_plain_row_s`), not the plain steps' own times, which keep samples of earlier
prompts.

A drafter's best case (`best_case`: every draft token accepted, 1 + k tokens for a draft of k, at the
cost of the forward at width 1 + k plus its known host time) tells where it can never pay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strategies.control.cost_model import best_case_speedup, host_cost, monotone_fit, segment_ends
from strategies.control.state import ControllerState
from strategies.verification.control import AUTOREGRESSIVE

BEST_CASE_STEPS = 16  # steps a drafter's best case at a bucket is kept (`StepCosts.best_case`)


class StepCosts(ControllerState):
    """Seconds per row of a step by the cost model, and what they make of a drafter's best case."""

    def _plain_row_s(self, b: int) -> float | None:
        """A plain step's seconds per row at bucket `b` by the cost model, what its modelled drafting steps
        (`_step_row_s`) are weighed against: the forward at width 1 (a plain step's host work, choosing
        and emitting a token, is a small share of it). Not the plain steps' own `row_time`: the forward's
        last few samples follow the context length of the prompts now decoding, while plain steps, rare
        once a drafter runs, keep samples of earlier prompts, and a short draft set against a plain step
        of a shorter prompt looks cheaper than it is. None: plain steps have not run at `b` (a drafter's
        host times are kept as ratios to theirs), or no forward was timed."""
        if (AUTOREGRESSIVE, b) not in self.row_time:
            return None
        return self.forward.row_seconds(b, 1)

    def _step_row_s(self, drafter: str, b: int, width: int) -> float | None:
        """Seconds per row of a step of `drafter` at bucket `b` whose forward is `width` tokens wide, by the
        cost model (its host time taken as none until measured); None: the model does not cover `b`."""
        forward = self.forward.row_seconds(b, width)
        return None if forward is None else forward + (self._host_row_s(drafter, b, width) or 0.0)

    def _priced_row_s(self, drafter: str, b: int, width: int) -> float | None:
        """`_step_row_s`, and `extrapolation_margin` more where `width` lies beyond every forward timed at
        `b` and the model extends a measured slope there: a guess is priced on the dear side. Where it
        has no slope to extend (one width measured anywhere), it stays flat: the optimistic side."""
        step = self._step_row_s(drafter, b, width)
        widths = self.forward.widths(b)
        if step is not None and widths and width > widths[-1] and self.forward.extrapolates(b):
            step *= 1 + self.settings.extrapolation_margin
        return step

    def _host_row_s(self, drafter: str, b: int, width: int) -> float | None:
        """A step's seconds per row besides the forward for `drafter` at bucket `b`, `width` wide, from
        `_host_curve` (`cost_model.host_cost`); None: not measured yet."""
        curve = self._host_curve(drafter, b)
        return None if curve is None else host_cost(curve, width, self.limits[drafter].per_depth)

    def _host_curve(self, drafter: str, b: int) -> tuple[list[int], list[float]] | None:
        """Seconds per row a step of `drafter` spends besides the forward (drafting, acceptance, bookkeeping)
        by the step's width, at `b` or the nearest bucket where it ran, fitted (`cost_model.monotone_fit`,
        once per step: it is asked for every width of every option); None: it has not run with a timed
        forward."""
        if ("host", drafter, b) not in self.memo:
            measured = {m for (name, m, _) in self.host_time if name == drafter}
            curve = None
            if measured:
                nearest = min(measured, key=lambda m: (abs(m.bit_length() - b.bit_length()), -m))
                plain = self.row_time[(AUTOREGRESSIVE, nearest)].value
                curve = monotone_fit(
                    {
                        w: (t.value * plain, len(t.recent))
                        for (name, m, w), t in self.host_time.items()
                        if (name, m) == (drafter, nearest)
                    }
                )
            self.memo[("host", drafter, b)] = curve
        return self.memo[("host", drafter, b)]

    def _step_cost(self, drafter: str, b: int) -> float:
        """The cheapest step of `drafter` at `b` (one draft token), for exploring cheapest first; 0 if unknown."""
        return self._step_row_s(drafter, b, 2) or 0.0

    def best_case(self, drafter: str, b: int) -> float | None:
        """The speed-up of `drafter` at bucket `b` if it drafted right every time, by the cost model: its
        known host time (none if unknown) and the forward at the cheapest width for each depth. None:
        the cost model does not cover `b`, or plain steps have not run there. Kept `BEST_CASE_STEPS`
        steps unless what it rests on changes in kind (a width measured there, the drafter's host time
        known): it moves slowly with the times, and every drafter's is asked every step."""
        return self._kept(self.best_cases, drafter, b, lambda: self._best_case(drafter, b))

    def _best_case(self, drafter: str, b: int, with_host: bool = True) -> float | None:
        """`best_case`, uncached; `with_host=False`: the forward's cost alone."""
        plain = self._plain_row_s(b)
        widths = self.forward.widths(b)
        if not plain or not widths:
            return None
        host = self._host_curve(drafter, b) if with_host else None
        corners = set(widths) | set(host[0] if host else ())  # both costs are piecewise linear
        depths = segment_ends(sorted(corners), self.limits[drafter].max_depth)
        step = (
            (lambda k: self._step_row_s(drafter, b, 1 + k))
            if with_host
            else lambda k: self.forward.row_seconds(b, 1 + k)
        )
        return best_case_speedup(depths, plain, step)

    def _kept(self, cache: dict, drafter: str, b: int, compute: Callable[[], Any]) -> Any:
        """`compute()` for `drafter` at bucket `b`, kept in `cache` `BEST_CASE_STEPS` steps unless what the
        cost model rests on there changes in kind (a width measured for the first time, the drafter's host
        time known). None is not kept."""
        basis = (tuple(self.forward.widths(b)), self._host_curve(drafter, b) is None)
        kept = cache.get((drafter, b))
        if kept is not None and kept[1] == basis and self.step - kept[0] < BEST_CASE_STEPS:
            return kept[2]
        value = compute()
        if value is not None:
            cache[(drafter, b)] = (self.step, basis, value)
        return value

    def _step_costs(self, drafter: str, b: int) -> list[float] | None:
        """A step of `drafter` drafting k = 1..max_depth tokens over a plain step at bucket `b`, by the
        cost model; None where it does not cover `b` or plain steps have not run there. Beyond the widest
        forward measured there, as dear as that one: the optimistic side, so that a drafter whose drafts
        would pay deeper drafts once and the model measures that width (extrapolated from a narrow
        curve's slope, a deep draft looked too dear ever to be tried). Kept as `best_case` is."""
        return self._kept(self.step_costs, drafter, b, lambda: self._modelled_step_costs(drafter, b))

    def _modelled_step_costs(self, drafter: str, b: int) -> list[float] | None:
        plain = self._plain_row_s(b)
        widest = max(self.forward.widths(b), default=1)
        depths = range(1, self.limits[drafter].max_depth + 1)
        steps = [self._step_row_s(drafter, b, min(1 + k, max(widest, 2))) for k in depths]
        return [step / plain for step in steps] if plain and None not in steps else None

"""Estimates of a drafter's speed-up over plain decoding, and the evidence each rests on.

For every drafter the controller keeps the smoothed tokens a row gains per step (τ), overall and per
batch bucket and node budget asked for, and smoothed step times per row per batch bucket. The estimated
speed-up of a drafter over plain decoding is then

    speedup = τ · t_plain / t_drafter

(tokens per second of each; this is E = (1 − α^{k+1}) / (1 − α) against the step's cost, both measured
where the drafter ran at this bucket), τ taken at the bucket and the size it would be planned at there
(`_tau`: each level shrunk toward the one above by the row steps behind it). At a bucket where it has
not run, its step is modelled (`step_costs.py`), or taken from the nearest bucket where it ran.

An estimate rests on the row steps it was measured over (`_evidence`), and is weighed by them against
another's (`_weighed`): at batch 1, a few steps are one prompt's luck, and the next prompt is another.
For a drafter that learns from what every row emits (a Lookahead trie, `DraftLimits.learns`) they halve
every `idle_half_life_rows` row steps decoded while it does not run, and its τ's average forgets as
much: what it was measured at while cold is asked again.
"""

from __future__ import annotations

import math

from strategies.control.sizing import DraftSizing
from strategies.verification.control import AUTOREGRESSIVE


class Estimates(DraftSizing):
    """Each option's estimated speed-up and cost ratio at a bucket, and the row steps behind them."""

    def speedup(self, drafter: str, b: int) -> float | None:
        """Estimated tokens/s of `drafter` over plain decoding at batch bucket `b` (None: unmeasured)."""
        if drafter == AUTOREGRESSIVE:
            return 1.0
        tau, ratio = self._tau(drafter, b), self.cost_ratio(drafter, b)
        if tau is None or ratio is None:
            return None
        return tau / ratio

    def _tau(self, drafter: str, b: int) -> float | None:
        """τ of `drafter` at bucket `b` and the node budget it would be planned at there (None: it has not
        drafted): its τ there at that budget, shrunk toward its τ at `b` over every budget by the row steps
        behind it (`evidence_rows`), that one shrunk alike toward its τ over every bucket. A batch's rows
        gain what its slower half gains (or, where rows join it, every row's mean: `_step_gain`), and a
        deeper draft gains more: one τ for every batch size and size weighed a draft at batch 8 on what it
        gained at batch 1."""
        overall = self.tau.get(drafter)
        if not overall:
            return None
        at = self.tau_at.get(drafter, {})
        if len(at) < 2:  # one bucket and budget: its τ there is the drafter's τ
            return overall.value
        if ("tau", drafter, b) not in self.memo:
            rows, k = self.settings.smoothing_rows, self.settings.evidence_rows
            here = {n: ema for (m, n), ema in at.items() if m == b}
            seen = sum(ema.seen for ema in here.values())
            mean = sum(ema.value * ema.seen for ema in here.values()) / seen if seen else 0.0
            tau = (mean * seen * rows + overall.value * k) / (seen * rows + k)
            own = here.get(self.draft_size(drafter, b)[1])
            if own is not None:
                tau = (own.value * own.seen * rows + tau * k) / (own.seen * rows + k)
            self.memo[("tau", drafter, b)] = tau
        return self.memo[("tau", drafter, b)]

    def cost_ratio(self, option: str, b: int) -> float | None:
        """A step of `option` over a plain step, at bucket `b`; until both are measured there, at the
        nearest bucket where they are (the larger of two as near: steps cost relatively more there),
        so a new batch size starts from what neighbouring ones taught instead of exploring again."""
        if option == AUTOREGRESSIVE:
            return 1.0
        if ("ratio", option, b) not in self.memo:
            measured = [m for (name, m) in self.row_time if name == option and (AUTOREGRESSIVE, m) in self.row_time]
            ratio = None
            modelled = self._host_curve(option, b) is not None and (AUTOREGRESSIVE, b) in self.row_time
            if b not in measured and modelled and self.forward.covers(b):
                # A new bucket where plain steps ran: the forward's cost at this width there, not another bucket's.
                plain = self._plain_row_s(b)
                step = self._priced_row_s(option, b, 1 + self.draft_size(option, b)[1])
                ratio = step / plain if plain and step is not None else None
            elif measured:
                nearest = min(measured, key=lambda m: (abs(m.bit_length() - b.bit_length()), -m))
                ratio = self.row_time[(option, nearest)].value
            self.memo[("ratio", option, b)] = ratio
        return self.memo[("ratio", option, b)]

    def _row_window(self, key: tuple[str, int]) -> int:
        """Measurements kept of `row_time[key]` ((option, bucket)): `time_window` of plain steps; of a
        drafter's step ratio, as many row steps as τ's moving average spans (a plain mean as old on
        average as its weights), at least `time_window`. A drafter's steps are of two kinds, a verify
        when it drafted and a plain step when it found nothing, in streaks: against τ's long average,
        a short window of times would make the estimate swing with the kind of the last few steps."""
        s = self.settings
        option, b = key
        if option == AUTOREGRESSIVE or s.smoothing >= 1:
            return s.time_window
        rows = 2 * s.smoothing_rows / -math.log(1 - s.smoothing)
        return max(s.time_window, math.ceil(rows / b))

    def _learns(self, drafter: str) -> bool:
        return drafter in self.limits and self.limits[drafter].learns

    def _aged(self, drafter: str) -> float:
        """What the evidence behind the estimate of `drafter` still counts for: halved every
        `idle_half_life_rows` row steps decoded since it last ran, if it learns from what every row emits
        (a Lookahead trie, `DraftLimits.learns`); whole otherwise."""
        if not self._learns(drafter):
            return 1.0
        idle = self.row_steps - self.evidence.get(drafter, (0.0, 0))[1]
        return 0.5 ** (idle / self.settings.idle_half_life_rows)

    def _evidence(self, drafter: str) -> float:
        """Row steps the estimate of `drafter` rests on (`_weighed`, `_hopeful`): those it was measured over,
        each counted as `_aged` says. A learning drafter measured on a cold trie in a job's first steps
        goes on learning from what other options emit: an estimate resting on those first steps for good
        would keep it idle."""
        if not self._learns(drafter):
            return self.measured.get(drafter, (0, 0))[1]
        rows = self.evidence[drafter][0] if drafter in self.evidence else self.measured.get(drafter, (0, 0))[1]
        return rows * self._aged(drafter)

    def _weighed(self, drafter: str, estimate: float) -> float:
        """`estimate` of `drafter` shrunk toward 1 (plain decoding) by the evidence behind it: the row
        steps it was measured over (`evidence_rows`)."""
        rows = self._evidence(drafter)
        return 1 + (estimate - 1) * rows / (rows + self.settings.evidence_rows)

    def _raised(self, drafter: str, estimate: float) -> float:
        """`estimate` of `drafter` raised by its spread: `probe_spread` / √rows over the row steps it rests on."""
        return estimate * (1 + self.settings.probe_spread / math.sqrt(max(1.0, self._evidence(drafter))))

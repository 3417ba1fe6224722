"""Exploring each option for a few steps, and probing those not in use again.

The controller plans a drafter at a bucket where even its best case loses (`_may_pay`: every draft
token accepted, against a plain step, not above 1 + h) only as a rare probe, every `max_probe_wait`
steps: that best case may rest on host times borrowed from another bucket. It says so once per
bucket, in an event of scope `explore`.

It explores each option for a few steps (plain steps at every batch size; a drafter once, for
`explore_steps` steps and `explore_rows` row steps, or one step holding both, at a large batch, or only
`explore_steps` where even its estimate raised by its spread loses to plain steps, the current
choice and every drafter explored in full, unless it learns, `_written_off`), those begun first, the
most promising of them first, then those whose card's τ says they would pay (EAGLE's), then the others
cheapest first (a first step teaches the model what a wider forward costs there, and drafters whose
best case then loses are never tried), and only while what
exploring steps lost against plain steps over the tokens their rows gained (as τ counts them) is at most
`explore_budget` of the decode time so far (`_explore_wait`): a cold job pays for exploration as it
decodes. An exploring step is priced at the width it will use (a learning drafter at the width its
steps have had), beyond the widest timed forward at the cost model's extrapolation and
`extrapolation_margin` more.

It probes an option it is not using again after a wait sized so that probes cost at most
`probe_budget` of the time in all (`probe_wait`), never sooner than `probe_every` steps nor later than
`max_probe_wait`: no choice is permanent, and a hopeless one costs little. A drafter whose estimate
raised by its spread beats the current choice's by more than the hysteresis, on too few row steps to
switch to it, is on trial instead (`_on_trial`): it runs step after step until its evidence switches
to it or its raised estimate falls back. A drafter known only from an earlier job's statistics is
probed as soon as it is the best estimate (`_unconfirmed_best`): a switch needs a fresh measurement.
"""

from __future__ import annotations

import math

from strategies.control.estimates import Estimates
from strategies.verification.control import AUTOREGRESSIVE


class Exploration(Estimates):
    """Which options are still to explore, when one fits the budget, and when each is due a probe."""

    def _may_pay(self, drafter: str, b: int) -> bool:
        """Whether `drafter` may be planned at bucket `b`: not when even its best case would not switch
        speculation on (said once per bucket, in an event), by the forward's cost, or by its own host time
        once that rests on a full exploration."""
        best, h = self.best_case(drafter, b), self.settings.hysteresis
        if best is None or best > 1 + h:
            return True
        if not self._measured_enough(drafter) and (self._best_case(drafter, b, with_host=False) or 0) > 1 + h:
            # Only its own host time rules it out, measured on a step or two, and a first one pays for
            # one-time work (Lookahead counts a row's prompt at its first proposal, and would be kept out
            # for good on that one step): it is explored in full first.
            return True
        if (drafter, b) not in self.hopeless:
            self.hopeless.add((drafter, b))
            reason = f"best case {best:.2f} <= {1 + self.settings.hysteresis:.2f}: rarely probed at this batch size"
            self._event("explore", drafter, AUTOREGRESSIVE, reason, batch_bucket=b)
        # Never for good: its best case rests on host times borrowed from the nearest bucket where it ran and
        # on forwards wider than any measured here, either of which may be wrong. A probe every
        # `max_probe_wait` steps measures it here, at a small share of the time.
        return self._since(drafter) > self.settings.max_probe_wait

    def _unexplored(self, option: str, b: int) -> bool:
        """Plain steps are measured at every bucket; a drafter until it has a few measurements anywhere
        (a new bucket borrows its cost from the nearest measured one, `cost_ratio`), or has shown on its
        first steps that it cannot win (`_written_off`)."""
        s = self.settings
        if option == AUTOREGRESSIVE:
            times = self.row_time.get((option, b))
            return times is None or times.count < s.explore_steps
        if self.speedup(option, b) is None:
            return True
        return not self._measured_enough(option) and not self._written_off(option, b)

    def _measured_enough(self, drafter: str) -> bool:
        """Whether `drafter` has run the steps and row steps that exploring asks for, anywhere."""
        s = self.settings
        steps, rows = self.measured.get(drafter, (0, 0))
        # At a large batch one step holds the row steps of several: it is enough on its own.
        return rows >= s.explore_rows and (steps >= s.explore_steps or rows >= s.explore_steps * s.explore_rows)

    def _written_off(self, drafter: str, b: int) -> bool:
        """Whether `drafter`, after `explore_steps` steps, is explored enough because even its estimate
        raised by its spread over the row steps behind it (`probe_spread` / √rows) stays below plain steps,
        the current choice and every drafter explored in full: the rest of its exploring steps could not
        make it the choice, and probes ask again. At batch 1 a drafter that plainly loses, or plainly
        trails one already explored, would otherwise take all of its `explore_rows` row steps, each a
        step the better one could have run. Not a drafter that learns from every row (a Lookahead trie):
        its first steps run cold."""
        if self.measured.get(drafter, (0, 0))[0] < self.settings.explore_steps or self._learns(drafter):
            return False
        explored = [o for o in self.limits if o != drafter and o not in self.failed and self._measured_enough(o)]
        bar = max([1.0, self.speedup(self.current, b) or 1.0, *(self.speedup(o, b) or 1.0 for o in explored)])
        return self._raised(drafter, self.speedup(drafter, b)) < bar

    def _explore_rank(self, drafter: str, b: int) -> tuple[int, float]:
        """Where `drafter` stands in the exploring order (smallest first): drafters whose exploration has
        begun, the most promising first (the estimate raised by its spread: one whose first step drafted
        deep and was accepted is explored in full, and can be chosen, before others that drafted little);
        then those not yet run that would pay at the τ their card records (`_card_speedup`), the most
        promising first: cheapest first, a drafter that pays several times plain decoding on a large target
        (EAGLE on the 0.5B twin at batch 8) waited while four that do not were explored, and a cold batch of
        64 steps ended first; then the others, cheapest first: their first steps teach the cost model what
        dearer ones would cost (one that has not run, its host time unknown, only looks cheaper)."""
        if drafter not in self.measured:
            carded = self._card_speedup(drafter, b)
            if carded is not None and carded > 1 + self.settings.hysteresis:
                return 1, -carded
            return 2, self._step_cost(drafter, b)
        estimate = self.speedup(drafter, b)
        return 0, -self._raised(drafter, estimate) if estimate is not None else 0.0

    def _card_speedup(self, drafter: str, b: int) -> float | None:
        """The speed-up of `drafter`, not yet run, at bucket `b` if it reached the τ its card records
        (`DraftLimits.card_tau`), over a step of its planned size by the cost model (its host time unknown:
        none); None without a card τ, or where plain steps or the cost model do not cover `b`. It orders
        exploration only: the card's text is not the job's."""
        tau = self.limits[drafter].card_tau
        plain = self._plain_row_s(b)
        if tau is None or not plain:
            return None
        step = self._step_row_s(drafter, b, 1 + self.draft_size(drafter, b)[1])
        return None if step is None else tau * plain / step

    def _explore_wait(self, drafter: str, b: int, batch_size: int) -> int:
        """Plain steps to run before a step exploring `drafter` fits in `explore_budget` of the decode time:
        what exploring steps lost against plain steps (`exploring_lost_s`) and what this one may lose (its
        time beyond the plain step that emits each row's own token, or once it has run beyond what its
        estimate says it emits, and its start as `_resume_cost` has seen it), against all steps' time; 0: it
        fits now, or its cost is unknown. Probes are not counted here: `probe_budget` bounds what they lose."""
        budget = self.settings.explore_budget
        width = self._explore_width(drafter, b)
        step = self._priced_row_s(drafter, b, width)
        if step is None:
            return 0
        plain = self.row_time[(AUTOREGRESSIVE, b)].value
        widest = self.forward.widths(b)[-1]
        if width > widest and not self.forward.extrapolates(b):  # no dearer than plain forwards side by side
            bound = self.forward.row_seconds(b, widest) * math.ceil(width / widest)
            step = max(step, bound + (self._host_row_s(drafter, b, width) or 0.0))
        step *= batch_size
        # Its time beyond the plain steps that would emit what its rows emit: a token each before it has run;
        # once it has, what its estimate says. Priced at a token a row, a drafter whose first step paid
        # waited for its second as long as for its first (EAGLE on the 0.5B twin at batch 8: some 20 plain
        # steps of a 64-step batch, by the cost model).
        estimate = self.speedup(drafter, b) if drafter in self.measured else None
        beyond = step * (1 - estimate) if estimate is not None else step - plain * batch_size
        may_lose = max(0.0, beyond) + self._resume_cost(drafter, b) * plain * batch_size
        deficit = (self.exploring_lost_s + may_lose) / budget - step - self.decode_s
        if deficit <= 0:
            return 0
        return math.ceil(deficit / (plain * batch_size))

    def _explore_width(self, drafter: str, b: int) -> int:
        """The forward width an exploring step of `drafter` at `b` is priced at: 1 + its planned nodes, or for
        a drafter that learns from every row (a cold Lookahead trie drafts far fewer nodes than its
        budget) the mean width its steps have had, once it has run."""
        width = 1 + self.draft_size(drafter, b)[1]
        if self._learns(drafter) and drafter in self.drafted_width:
            return min(width, max(1, round(self.drafted_width[drafter].value)))
        return width

    def _resume_cost(self, drafter: str, b: int) -> float:
        """What running `drafter` again at bucket `b` after another option costs in starting it, in plain
        steps: the mean of its last such steps' starts (a draft model's prefill of its rows, when a probe
        falls in a new batch), 0 until one is seen. A drafter that learns from every row (a Lookahead trie)
        pays its counting wherever it runs, as learning: not counted. Weighed at none, a draft model's
        probes at batch 1, each in a new prompt, would each pay a prefill the probe wait never saw."""
        setups = self.resume_setup.get((drafter, b))
        return math.fsum(setups) / len(setups) if setups else 0.0

    def _unconfirmed_best(self, options: list[str], b: int) -> str | None:
        """The drafter with the best estimate, if that estimate comes only from loaded statistics (it
        has not run in this actor) and would switch speculation on or over: one step of it now gives
        `_choose` the fresh evidence a switch needs, where waiting for its probe would cost many steps."""
        estimates = {o: self.speedup(o, b) for o in options if o != AUTOREGRESSIVE}
        known = [o for o, e in estimates.items() if e is not None]
        if not known:
            return None
        best = max(known, key=lambda o: estimates[o])
        current = self.speedup(self.current, b) or 1.0
        favoured = estimates[best] > max(1.0, current) * (1 + self.settings.hysteresis)
        return best if favoured and best not in self.last_used else None

    def probe_wait(self, option: str, b: int) -> int:
        """Steps between probes of `option` at bucket `b`: a probe loses the option's step time times
        its speed deficit against the current choice; each option not in use may lose its share of
        `probe_budget`."""
        s = self.settings
        own, current = self.cost_ratio(option, b), self.cost_ratio(self.current, b)
        estimate, current_estimate = self.speedup(option, b), self.speedup(self.current, b)
        if own is None or not current or estimate is None or not current_estimate:
            return s.probe_every
        if self._on_trial(option, estimate, current_estimate):
            return 1
        lost = own * max(0.0, 1 - self._hopeful(option, estimate) / current_estimate)  # in plain steps
        lost += self._resume_cost(option, b)
        share = s.probe_budget / max(1, len(self.limits) - len(self.failed))  # options besides the current
        return int(min(s.max_probe_wait, max(s.probe_every, lost / (share * current))))

    def _hopeful(self, option: str, estimate: float) -> float:
        """`estimate` of drafter `option` raised by its spread, `probe_spread` / √rows over the row steps
        it rests on, while another drafter runs, for the loss a probe of it is weighed at: two drafters
        that both pay are close, and one measured on a few steps of a cold state (a Lookahead trie at the
        start of a job) ranks below one measured on hundreds: weighed as measured, such a drafter would be
        probed a row step every few hundred steps, never gathering what a switch to it needs, though it
        pays more. Beside plain steps a probe's deficit is weighed as it is: where nothing pays, probing
        must stay cheap."""
        if AUTOREGRESSIVE in (option, self.current):
            return estimate
        return self._raised(option, estimate)

    def _on_trial(self, option: str, estimate: float, current_estimate: float) -> bool:
        """Whether drafter `option`, its estimate raised by its spread (`_hopeful`), beats the current
        drafter's by more than the hysteresis on too few row steps to switch to it (`_weighed`, as
        `_choose` weighs it): probed one step at a time it would gather a row step per probe at batch 1,
        never the hundreds a switch needs, so it runs at once instead, until its evidence switches to it
        or its raised estimate falls back (a few row steps where its estimate is what was measured).
        Trials on the raised estimate, not the measured one, let a drafter that pays more be chosen
        several times sooner."""
        if AUTOREGRESSIVE in (option, self.current):  # plain steps turn speculation on unweighed
            return False
        bar = current_estimate * (1 + self.settings.hysteresis)
        return self._hopeful(option, estimate) > bar >= self._weighed(option, estimate)

    def _probe_due(self, option: str, b: int) -> bool:
        return self._since(option) >= self.probe_wait(option, b)

    def _since(self, option: str) -> int:
        """Steps since `option` last ran, counting the one about to be planned."""
        return self.step + 1 - self.last_used.get(option, 0)

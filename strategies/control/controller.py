"""The adaptive controller: keep acceleration where it pays, measured, per batch size.

A policy object fed by statistics (docs/design.md, "The adaptive controller"): it estimates each
drafter's speed-up over plain decoding at the batch's size (`estimates.py`), explores and probes the
options it is not sure of (`exploration.py`), sizes drafts (`sizing.py`) and learns from every step
(`observation.py`). `plan` is the decision rule, top to bottom. The parts are floors, each using only
those below it: `state` ← `step_costs` ← `sizing` ← `estimates` ← `exploration`, `observation` ←
`AdaptiveController`.

It follows the best estimate with hysteresis (`_choose`): speculation goes off when the best falls
below 1 − h and comes back above 1 + h, on or over to another drafter only right after that drafter ran
(fresh evidence: step times drift, and an old measurement of a drafter against a fresh one of plain
steps would switch on noise); a drafter that pays gives way to another only on that one's estimate
shrunk toward 1 by the row steps it rests on (`evidence_rows`), against its own shrunk alike: chosen
from plain steps on a few row steps, a drafter's estimate is as much its prompt's luck as another's.
Options are weighed before anything else is planned, explorations and probes, so that a switch rests on
the step just taken.
"""

from __future__ import annotations

import dataclasses

from strategies.control.exploration import Exploration
from strategies.control.observation import Observation
from strategies.control.settings import ControllerSettings, Learned
from strategies.control.state import RowDrafting, bucket
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, Plan

# What importers take from here: the controller, what it is told, what it learned, and its bucketing.
__all__ = ["AdaptiveController", "ControllerSettings", "Learned", "bucket"]


class AdaptiveController(Exploration, Observation):
    """The `Controller` a speculative strategy asks each step (`strategies.verification.control`)."""

    def start_batch(self, drafters: dict[str, DraftLimits], batch_size: int) -> None:
        self.limits = dict(drafters)
        self.memo.clear()
        self.standing = None
        for name, limits in drafters.items():
            start = limits.max_depth if limits.start_depth is None else limits.start_depth
            # Sizes learned under other limits (another job's, `warm_start`) are kept within these.
            self.depth[name] = min(self.depth.get(name, start), limits.max_depth)
            if limits.trees:
                self.nodes[name] = min(self.nodes.get(name, limits.first_nodes), limits.max_nodes)
            else:
                self.nodes[name] = self.depth[name]
        self.failed = set()
        if self.current not in self.limits:
            self.current = AUTOREGRESSIVE
        self.rows = [RowDrafting() for _ in range(batch_size)]
        self.refilled = False

    def plan(self, batch_size: int) -> Plan:
        b = bucket(batch_size)
        self._enter_bucket(b)
        if self.standing is not None and self.standing[0] == batch_size and self.step < self.standing[1]:
            # Its sizes too: weighing them again costs about what weighing the options does.
            return dataclasses.replace(self.standing[2], rows_off=self._rows_off())
        self.standing = None
        options = [AUTOREGRESSIVE, *(o for o in self.limits if o not in self.failed and self._may_pay(o, b))]
        if self.current not in options:
            self._event("batch", self.current, AUTOREGRESSIVE, "its best case loses to plain steps", batch_bucket=b)
            self.current = AUTOREGRESSIVE
        if self._unexplored(AUTOREGRESSIVE, b):
            return self._plan_for(AUTOREGRESSIVE, b)
        # Weighed before anything else is planned: a switch rests on the step just taken (`_choose`), which
        # may have been the last of a drafter's exploration. Weighed after the next exploring step, that
        # drafter would be chosen only at its next probe, and while the budget refills for the next
        # drafter to explore, plain steps would run where a drafter known to pay could.
        self._choose(options, b)
        # One at a time (`_explore_rank`): a drafter whose exploration has begun before one not yet run, the
        # most promising first; a drafter whose exploration is finished can be chosen while the budget
        # refills for the next. One not yet run does not cut in while the budget refills: it would spend
        # the budget that lets a drafter whose exploration has begun, perhaps one that pays, finish it and
        # be chosen.
        unexplored = sorted((o for o in options[1:] if self._unexplored(o, b)), key=lambda o: self._explore_rank(o, b))
        if unexplored and self._explore_wait(unexplored[0], b, batch_size) == 0:
            return self._plan_for(unexplored[0], b, exploring=True)
        unconfirmed = self._unconfirmed_best(options, b)
        if unconfirmed is not None:
            return self._plan_for(unconfirmed, b)
        # Probes come after the weighing above: a probe of another option in between would take the step
        # just taken its freshness (another drafter's trial, its steps after each probe of a better one,
        # would keep that one from ever being chosen).
        due = [o for o in options if o != self.current and o not in unexplored and self._probe_due(o, b)]
        if due:
            return self._plan_for(min(due, key=lambda o: self.last_used.get(o, 0)), b)
        plan = self._plan_for(self.current, b)
        if self.current != AUTOREGRESSIVE:
            self.standing = (batch_size, self.step + self.settings.replan_rows // batch_size, plan)
        else:
            # Nothing changes the choice before the next probe or exploration: plain steps run until then unasked.
            waits = [self.probe_wait(o, b) - self._since(o) for o in options[1:] if o not in unexplored]
            waits += [self._explore_wait(o, b, batch_size) for o in unexplored[:1]]
            plan.steps = max(1, min(waits)) if waits else None
        return plan

    def _enter_bucket(self, b: int) -> None:
        """The choice is kept per batch bucket: entering bucket `b`, the option chosen there last time is
        current again (a new bucket starts from the one left). A batch decoded to its end passes through
        its smaller buckets as rows finish, where a drafter may lose that pays at the full batch; with one
        choice for all, plain steps chosen in a batch's tail carried into the next full batch, which ran
        them until the drafter's next probe (`_choose` turns a drafter on only on a fresh step of it)."""
        if b == self.planned_bucket:
            return
        if self.planned_bucket is not None:
            self.chosen_at[self.planned_bucket] = self.current
        self.current = self.chosen_at.get(b, self.current)
        self.planned_bucket = b

    def _choose(self, options: list[str], b: int) -> None:
        h = self.settings.hysteresis
        estimates = {o: self.speedup(o, b) for o in options}
        drafters = [o for o in options if o != AUTOREGRESSIVE and estimates[o] is not None]
        # Ranked on the estimates weighed by the row steps behind them: a high estimate on a few rows is
        # one prompt's luck beside a lower one on a thousand.
        best = max(drafters, key=lambda o: self._weighed(o, estimates[o]), default=AUTOREGRESSIVE)
        best_gain = estimates[best] or 1.0
        current_gain = estimates.get(self.current) or 1.0
        current_weighed = self._weighed(self.current, current_gain)
        if self.current == AUTOREGRESSIVE:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {best_gain:.2f} > {1 + h:.2f}"
        elif current_gain < 1 - h:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {current_gain:.2f} < {1 - h:.2f}"
        elif best != self.current and self._weighed(best, best_gain) > (1 + h) * current_weighed:
            target, reason = best, f"{best} estimated {best_gain:.2f} vs {current_gain:.2f}"
        else:
            return
        if target not in (AUTOREGRESSIVE, self.current) and self.last_used.get(target) != self.step:
            # Its measurements are old: the machine may have been faster then. Turn speculation on
            # (or over) right after the option's next probe, on fresh evidence; off at once.
            if self.current == AUTOREGRESSIVE or current_gain >= 1 - h:
                return
            target = AUTOREGRESSIVE
        if target != self.current:
            rounded = {o: (round(e, 3) if e is not None else None) for o, e in estimates.items()}
            self._event("batch", self.current, target, reason, estimates=rounded, batch_bucket=b)
            self.current = target

    def _plan_for(self, option: str, b: int, exploring: bool = False) -> Plan:
        """The plan that runs `option` at bucket `b`; `exploring`: a step that explores it, counted against
        `explore_budget`."""
        self.exploring = option if exploring else None
        if option == AUTOREGRESSIVE:
            return Plan(AUTOREGRESSIVE, 0, 0)
        off = self._rows_off()
        depth, nodes = self.draft_size(option, b)
        self.planned_nodes[option] = nodes
        limits = self.limits[option]
        if not limits.sizes_own:
            return Plan(option, depth, nodes, rows_off=off)
        # It sizes its drafts itself: it may go as deep as allowed, and is told what depths cost.
        return Plan(option, limits.max_depth, limits.max_nodes, rows_off=off, step_costs=self._step_costs(option, b))

    def _rows_off(self) -> set[int]:
        """Batch rows whose drafts were rejected `row_patience` times running, cooling down."""
        return {b for b, row in enumerate(self.rows) if row.off_until > self.step + 1}

    def worth_learning(self, drafter: str, batch_size: int) -> bool:
        """A drafter whose estimate is unknown or near break-even may win once it has learned more
        (a cold Lookahead trie drafts little); one far below it is not fed batches it would not serve."""
        estimate = self.speedup(drafter, bucket(batch_size))
        return estimate is None or estimate >= self.settings.learn_above

    def drafter_failed(self, drafter: str, reason: str) -> None:
        self.failed.add(drafter)
        self.standing = None
        if self.current == drafter:
            self.current = AUTOREGRESSIVE
        # Nor is it the choice kept at another bucket: told once, here, not again as a bucket is entered.
        self.chosen_at = {b: AUTOREGRESSIVE if o == drafter else o for b, o in self.chosen_at.items()}
        self._event("batch", drafter, AUTOREGRESSIVE, reason)

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[b] for b in rows]

    def add_rows(self, count: int) -> None:
        self.rows += [RowDrafting() for _ in range(count)]
        self.refilled = True

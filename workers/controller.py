"""The adaptive controller: keep acceleration where it pays, measured, per batch size.

A policy object fed by statistics (DESIGN.md, "The adaptive controller"). For every drafter and for
plain autoregressive steps it keeps smoothed step times per batch-size bucket (powers of two), and
for every drafter the smoothed tokens a row gains per step (τ). The estimated speed-up of a drafter
over plain decoding is then

    speedup = τ · t_plain / t_drafter

(tokens per second of each; this is E = (1 − α^{k+1}) / (1 − α) against the step's cost, both
measured rather than modelled). The controller

- explores each option for a few steps at a new batch size, then follows the best estimate, with
  hysteresis: speculation goes off when the best falls below 1 − h and comes back above 1 + h;
- probes an option it is not using after `probe_every` steps, doubling the wait each time the
  probe does not win (up to 8×), so no choice is permanent and a hopeless one costs little;
- turns drafting off for a row whose drafts were rejected `row_patience` steps in a row, for
  `row_cooldown` steps;
- sizes drafts: chains grow by one while most drafted tokens are accepted and shrink while few
  are; trees double or halve their node budget by how deep the accepted path reaches.

Every switch is an event (scope, from, to, reason, estimates) that the worker logs. It lives as
long as its actor, so what it learned carries over from batch to batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strategies.control import AUTOREGRESSIVE, Plan, StepRecord


@dataclass(frozen=True)
class ControllerSettings:
    smoothing: float = 0.3  # weight of a new measurement in the moving averages
    hysteresis: float = 0.05
    explore_steps: int = 2  # measurements of each option at a batch size before trusting estimates
    probe_every: int = 24
    row_patience: int = 4
    row_cooldown: int = 16
    min_tree_nodes: int = 4


@dataclass
class Ema:
    value: float = 0.0
    count: int = 0

    def update(self, x: float, weight: float) -> None:
        self.value = x if self.count == 0 else (1 - weight) * self.value + weight * x
        self.count += 1


def bucket(batch_size: int) -> int:
    """Batch sizes share statistics within powers of two."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class AdaptiveController:
    settings: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        self.step_time: dict[tuple[str, int], Ema] = {}
        self.tau: dict[str, Ema] = {}
        self.depth: dict[str, int] = {}
        self.nodes: dict[str, int] = {}
        self.limits: dict[str, tuple[int, int]] = {}
        self.current = AUTOREGRESSIVE
        self.step = 0
        self.last_used: dict[str, int] = {}
        self.probe_wait: dict[str, int] = {}
        self.events: list[dict] = []
        self.failed: set[str] = set()
        self.row_streak: list[int] = []
        self.row_off_until: list[int] = []

    # -- the Controller protocol ---------------------------------------------------------------

    def start_batch(self, drafters: dict[str, tuple[int, int]], batch_size: int) -> None:
        self.limits = dict(drafters)
        for name, (max_depth, max_nodes) in drafters.items():
            self.depth.setdefault(name, max_depth)
            self.nodes.setdefault(name, max_nodes)
        self.failed = set()
        if self.current not in self.limits:
            self.current = AUTOREGRESSIVE
        self.row_streak = [0] * batch_size
        self.row_off_until = [0] * batch_size

    def plan(self, batch_size: int) -> Plan:
        self.step += 1
        b = bucket(batch_size)
        options = [AUTOREGRESSIVE, *(name for name in self.limits if name not in self.failed)]
        unexplored = [o for o in options if self._measured(o, b) < self.settings.explore_steps]
        if unexplored:
            return self._plan_for(unexplored[0])
        due = [o for o in options if o != self.current and self._probe_due(o)]
        if due:
            stale = min(due, key=lambda o: self.last_used.get(o, 0))
            # Each probe that does not win doubles the option's wait (reset when it is chosen).
            self.probe_wait[stale] = min(8 * self.settings.probe_every, 2 * self._wait(stale))
            return self._plan_for(stale)
        self._choose(options, b)
        return self._plan_for(self.current)

    def observe(self, record: StepRecord) -> None:
        s = self.settings
        b = bucket(record.batch_size)
        self.step_time.setdefault((record.drafter, b), Ema()).update(record.wall_s, s.smoothing)
        self.last_used[record.drafter] = self.step
        if record.drafter == AUTOREGRESSIVE:
            return
        gained = [a + 1 for a in record.accepted]
        self.tau.setdefault(record.drafter, Ema()).update(sum(gained) / len(gained), s.smoothing)
        self._resize(record)
        for row, (drafted, accepted) in enumerate(zip(record.drafted, record.accepted, strict=True)):
            if drafted and not accepted:
                self.row_streak[row] += 1
                if self.row_streak[row] >= s.row_patience:
                    self.row_off_until[row] = self.step + s.row_cooldown
                    self.row_streak[row] = 0
                    self._event("row", record.drafter, AUTOREGRESSIVE, f"{s.row_patience} drafts rejected", row=row)
            elif accepted:
                self.row_streak[row] = 0

    def drafter_failed(self, drafter: str, reason: str) -> None:
        self.failed.add(drafter)
        if self.current == drafter:
            self.current = AUTOREGRESSIVE
        self._event("batch", drafter, AUTOREGRESSIVE, reason)

    def keep_rows(self, rows: list[int]) -> None:
        self.row_streak = [self.row_streak[r] for r in rows]
        self.row_off_until = [self.row_off_until[r] for r in rows]

    # -- policy ---------------------------------------------------------------------------------

    def speedup(self, drafter: str, b: int) -> float | None:
        """Estimated tokens/s of `drafter` over plain decoding at batch bucket `b` (None: unmeasured)."""
        if drafter == AUTOREGRESSIVE:
            return 1.0
        plain, own, tau = (
            self.step_time.get((AUTOREGRESSIVE, b)),
            self.step_time.get((drafter, b)),
            self.tau.get(drafter),
        )
        if not (plain and own and tau) or own.value <= 0:
            return None
        return tau.value * plain.value / own.value

    def drain_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def _wait(self, option: str) -> int:
        return self.probe_wait.get(option, self.settings.probe_every)

    def _probe_due(self, option: str) -> bool:
        return self.step - self.last_used.get(option, 0) >= self._wait(option)

    def _measured(self, option: str, b: int) -> int:
        ema = self.step_time.get((option, b))
        return ema.count if ema else 0

    def _choose(self, options: list[str], b: int) -> None:
        h = self.settings.hysteresis
        estimates = {o: self.speedup(o, b) for o in options}
        drafters = [o for o in options if o != AUTOREGRESSIVE and estimates[o] is not None]
        best = max(drafters, key=lambda o: estimates[o], default=AUTOREGRESSIVE)
        best_gain = estimates[best] or 1.0
        current_gain = estimates.get(self.current) or 1.0
        if self.current == AUTOREGRESSIVE:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {best_gain:.2f} > {1 + h:.2f}"
        elif current_gain < 1 - h:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {current_gain:.2f} < {1 - h:.2f}"
        elif best != self.current and best_gain > current_gain * (1 + h):
            target, reason = best, f"{best} estimated {best_gain:.2f} vs {current_gain:.2f}"
        else:
            return
        if target != self.current:
            rounded = {o: (round(e, 3) if e is not None else None) for o, e in estimates.items()}
            self._event("batch", self.current, target, reason, estimates=rounded, batch_bucket=b)
            self.current = target
            self.probe_wait.pop(target, None)

    def _plan_for(self, option: str) -> Plan:
        if option == AUTOREGRESSIVE:
            return Plan(AUTOREGRESSIVE, 0, 0)
        off = {row for row, until in enumerate(self.row_off_until) if until > self.step}
        return Plan(option, self.depth[option], self.nodes[option], rows_off=off)

    def _resize(self, record: StepRecord) -> None:
        name = record.drafter
        drafted = sum(record.drafted)
        if not drafted:
            return
        max_depth, max_nodes = self.limits[name]
        accepted = sum(record.accepted)
        if max_nodes > max_depth:  # a tree: spend nodes where paths go deep
            reach = accepted / sum(1 for d in record.drafted if d) / self.depth[name]
            if reach >= 0.6:
                self.nodes[name] = min(max_nodes, self.nodes[name] * 2)
            elif reach <= 0.2:
                self.nodes[name] = max(min(self.settings.min_tree_nodes, max_nodes), self.nodes[name] // 2)
            return
        rate = accepted / drafted
        if rate >= 0.8:
            self.depth[name] = min(max_depth, self.depth[name] + 1)
        elif rate < 0.4:
            self.depth[name] = max(1, self.depth[name] - 1)
        self.nodes[name] = self.depth[name]

    def _event(self, scope: str, source: str, target: str, reason: str, **details) -> None:
        self.events.append(
            {"scope": scope, "from": source, "to": target, "reason": reason, "step": self.step, **details}
        )

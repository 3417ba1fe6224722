"""What the controller learns: from each step it observes, from forwards timed before decoding, and
from an earlier job's controllers (`Learned`).

A step moves its option's time per row at its bucket, the cost model's forward and host times, the
drafter's τ (`_step_gain`: the tokens its slower half of rows gained where a batch ends with its slowest
rows, the mean where finished rows' places are filled by new ones), what the
drafter's start cost where it ran after another option, and what a step exploring it lost against
plain steps. A row whose drafts were rejected `row_patience` steps in a row drafts no more for
`row_cooldown` steps, when the batch has other rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from strategies.control.cost_model import RecentTime
from strategies.control.estimates import Estimates
from strategies.control.settings import Learned
from strategies.control.state import Ema, bucket
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, StepRecord


def _slower_half_gain(accepted: list[int]) -> float:
    """Tokens a step moved its batch's end by: the mean gain of its slower half of rows. A batch ends with
    its slowest rows: a drafter that speeds up half the rows leaves the other half to tail steps that cost
    about as much as full ones."""
    gained = sorted(a + 1 for a in accepted)[: max(1, len(accepted) // 2)]
    return sum(gained) / len(gained)


def _step_gain(accepted: list[int], refilled: bool) -> float:
    """Tokens a step's drafting gained the batch, per row: the slower half's (`_slower_half_gain`) in a
    batch that decodes its rows to the end, every row's mean in one whose finished rows are replaced by
    new ones (a job's engine, continuous batching). There a row that finishes early frees its place for
    a row that decodes at once: no tail waits for the slow rows, and counting only them writes off a
    drafter that speeds up part of the batch (cold jobs on the JSON synthesis set at batch 8: counted by
    the slower half, Lookahead emitted 1% and 7% of two jobs' tokens; by the mean, 80-82% of each, in
    docs/benchmarks.md)."""
    if refilled:
        return sum(a + 1 for a in accepted) / len(accepted)
    return _slower_half_gain(accepted)


class Observation(Estimates):
    """Every measurement a step brings, and what the controller carries from job to job."""

    def observe(self, record: StepRecord) -> None:
        b = bucket(record.batch_size)
        self.step += 1
        plain = self.row_time.get((AUTOREGRESSIVE, b))
        drafting = record.drafter != AUTOREGRESSIVE
        gain = _step_gain(record.accepted, self.refilled) if drafting else 1.0  # a plain step moves every row by one
        self._observe_times(record, b, plain, gain)
        aged, evidence = self._aged(record.drafter), self._evidence(record.drafter)
        steps, rows = self.measured.get(record.drafter, (0, 0))
        self.measured[record.drafter] = (steps + 1, rows + record.batch_size)
        self.row_steps += record.batch_size
        self.memo.clear()
        self.last_used[record.drafter] = self.step
        if not drafting:
            return
        width = self.drafted_width.setdefault(record.drafter, RecentTime(self.settings.time_window))
        width.update(record.width)
        self._observe_gain(record, b, gain, aged, evidence)
        tally = self._tally_drafts(record, b)
        if tally is not None:
            self._resize(record.drafter, b, tally, self.cost_ratio(record.drafter, b))
        self.memo.clear()  # sizes may have changed
        self._observe_rows(record)

    def _observe_times(self, record: StepRecord, b: int, plain: RecentTime | None, gain: float) -> None:
        """The step's time per row, the drafter's start where it resumed, what an exploring step lost, and
        the forward's and the drafter's host time; `plain`: plain steps' times at `b`, as they were before it."""
        s = self.settings
        key = (record.drafter, b)
        row_time = record.wall_s / record.batch_size
        if record.drafter == AUTOREGRESSIVE:
            self.row_time.setdefault(key, RecentTime(self._row_window(key))).update(row_time)
        elif plain is not None:  # plain steps run first at every bucket: a drafter's has one to relate to
            self.row_time.setdefault(key, RecentTime(self._row_window(key))).update(row_time / plain.value)
        self.decode_s += record.wall_s + record.setup_s
        resumed = self.last_used.get(record.drafter) != self.step - 1
        if record.drafter != AUTOREGRESSIVE and resumed and plain is not None and not self._learns(record.drafter):
            setups = self.resume_setup.setdefault(key, deque(maxlen=s.time_window))
            setups.append(record.setup_s / record.batch_size / plain.value)
        if record.drafter == self.exploring:
            # A step exploring a drafter loses what it took beyond plain steps moving the batch's end as far
            # (its slower half's tokens, as τ counts them: the faster rows' extra tokens leave the batch to
            # end as late), and starting the drafter for it (a draft model's prefill of the batch); one that
            # paid lost nothing. Counted whole, a step of prompt lookup that found no match, a plain step
            # but for some microseconds, would cost the budget a plain step, and hold back a cheap drafter
            # for many plain steps before it could be chosen.
            plain_s = plain.value * len(record.accepted) * gain if plain is not None else 0.0
            self.exploring_lost_s += record.setup_s + max(0.0, record.wall_s - plain_s)
            self.exploring_s += record.setup_s + record.wall_s
        self.exploring = None
        if record.forward_s is not None:
            forward_width = record.computed_width or record.width  # what the forward's time was spent on
            self.forward.observe(b, forward_width, record.forward_s / record.batch_size)
            if record.drafter != AUTOREGRESSIVE and plain is not None:
                host = max(0.0, record.wall_s - record.forward_s) / record.batch_size
                key = (record.drafter, b, record.width)
                self.host_time.setdefault(key, RecentTime(s.time_window)).update(host / plain.value)

    def _observe_gain(self, record: StepRecord, b: int, gain: float, aged: float, evidence: float) -> None:
        """τ of the step's drafter, at its bucket `b` and node budget, and of its node budget if it drafts
        trees; `aged` and `evidence`: what its evidence counted for and came to before the step (`_aged`,
        `_evidence`)."""
        s = self.settings
        at = self.tau_at.setdefault(record.drafter, {})
        if self._learns(record.drafter):
            self.evidence[record.drafter] = (evidence + record.batch_size, self.row_steps)
            # What it was measured at while idle counts as the evidence does.
            for ema in [*at.values(), *([self.tau[record.drafter]] if record.drafter in self.tau else [])]:
                ema.seen *= aged
        share = min(1.0, len(record.accepted) / s.smoothing_rows)
        weight = 1 - (1 - s.smoothing) ** share
        self.tau.setdefault(record.drafter, Ema()).update(gain, weight, share)
        # What it was asked for: a step that found nothing to draft is one of that size's steps too.
        asked = self.planned_nodes.get(record.drafter) or self.nodes.get(record.drafter) or max(record.drafted)
        at.setdefault((b, asked), Ema()).update(gain, weight, share)
        if self.limits.get(record.drafter, DraftLimits(0, 0)).trees:
            budget = self.planned_nodes.get(record.drafter, max(record.drafted))
            ema = self.tree_tau.setdefault(record.drafter, {}).setdefault(budget, Ema())
            ema.seen = self._tree_evidence(record.drafter, budget, ema)  # what it has seen since counts more
            ema.update(gain, weight, share)
            self.tree_tau_at[(record.drafter, budget)] = self.measured[record.drafter][1]

    def _observe_rows(self, record: StepRecord) -> None:
        """Each row's streak of rejected drafts: one that reaches `row_patience` drafts no more for
        `row_cooldown` steps."""
        s = self.settings
        for b, (drafted, accepted) in enumerate(zip(record.drafted, record.accepted, strict=True)):
            if drafted and not accepted:
                row = self.rows[b]
                row.streak += 1
                # A row alone is the batch: whether its drafts pay is the batch estimate's to say, and a
                # streak of rejections is common where a drafter pays on average (Lookahead trees).
                if row.streak >= s.row_patience and record.batch_size > 1:
                    row.off_until = self.step + s.row_cooldown
                    row.streak = 0
                    self._event("row", record.drafter, AUTOREGRESSIVE, f"{s.row_patience} drafts rejected", row=b)
            elif accepted:
                self.rows[b].streak = 0

    def drain_exploring(self) -> dict[str, float]:
        """Seconds since the last call of exploring steps (`exploring_s`), of what they lost against plain
        steps over their tokens (`exploring_lost_s`: what `explore_budget` limits) and of every step
        (`decoding_s`), each with the starts of drafters it paid for: the job adds up its actors' records."""
        now = (self.exploring_s, self.exploring_lost_s, self.decode_s)
        explored, lost, decoded = (a - b for a, b in zip(now, self._drained, strict=True))
        self._drained = now
        return {"exploring_s": round(explored, 6), "exploring_lost_s": round(lost, 6), "decoding_s": round(decoded, 6)}

    def time_forwards(self, batch_size: int, seconds_by_width: dict[int, list[float]]) -> None:
        """Forwards timed before decoding (an actor's start, `workers.warm_up`): per width (new tokens
        per row, 1 among them), the seconds of forwards over `batch_size` rows. Without them a cold
        controller prices a drafter's first step, wider than any forward it has run, as that many plain
        steps, and the exploration budget holds a cold job at batch 1 to plain steps long before its
        first draft."""
        b = bucket(batch_size)
        for width in sorted(seconds_by_width):  # the plain forward first: wider ones are kept as ratios to it
            for seconds in seconds_by_width[width]:
                self.forward.observe(b, width, seconds / batch_size)
        self.memo.clear()

    def learned(self) -> Learned:
        """What this controller learned, for the next job's controllers (`warm_start`)."""
        return Learned(
            row_time={key: (list(t.recent), t.count) for key, t in self.row_time.items()},
            tau={name: (ema.value, ema.seen) for name, ema in self.tau.items()},
            measured=dict(self.measured),
            depth=dict(self.depth),
            nodes=dict(self.nodes),
            forward_time={key: (list(t.recent), t.count) for key, t in self.forward.times.items()},
            host_time={key: (list(t.recent), t.count) for key, t in self.host_time.items()},
            tau_at={(name, *at): (ema.value, ema.seen) for name, by in self.tau_at.items() for at, ema in by.items()},
            tree_tau={(name, n): (ema.value, ema.seen) for name, by in self.tree_tau.items() for n, ema in by.items()},
        )

    def warm_start(self, learned: Learned) -> None:
        """Start from what an earlier job's controllers learned (before the first batch): options and
        batch buckets it covers are not explored again; measurements of this job go on updating it."""
        s = self.settings

        def times(learned_times: dict, window: Callable[[Any], int] = lambda key: s.time_window) -> dict:
            return {
                key: RecentTime(window(key), recent=deque(recent[-window(key) :]), count=count)
                for key, (recent, count) in learned_times.items()
            }

        self.row_time.update(times(learned.row_time, self._row_window))
        self.forward.load(times(learned.forward_time))
        self.host_time.update(times(learned.host_time))
        self.tau = {name: Ema(value, seen) for name, (value, seen) in learned.tau.items()}
        self.tau_at, self.tree_tau = {}, {}
        for (name, b, budget), (value, seen) in learned.tau_at.items():
            self.tau_at.setdefault(name, {})[(b, budget)] = Ema(value, seen)
        for (name, budget), (value, seen) in learned.tree_tau.items():
            self.tree_tau.setdefault(name, {})[budget] = Ema(value, seen)
        self.measured = dict(learned.measured)
        # A tree budget's τ counts as measured when the loaded statistics were: it ages from here (`_tree_evidence`).
        self.tree_tau_at = {(name, budget): self.measured.get(name, (0, 0))[1] for name, budget in learned.tree_tau}
        self.depth, self.nodes = dict(learned.depth), dict(learned.nodes)
        self.memo.clear()

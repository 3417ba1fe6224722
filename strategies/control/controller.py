"""The adaptive controller: keep acceleration where it pays, measured, per batch size.

A policy object fed by statistics (docs/design.md, "The adaptive controller"). For every drafter and for
plain autoregressive steps it keeps smoothed step times per row per batch-size bucket (powers of
two), a drafter's as its ratio to the plain step's time at its bucket when it ran (a 2-core
machine's speed drifts with what else runs: a drafter measured while it was loaded must not look
slow, or fast, against plain steps measured since), and for every drafter the smoothed tokens a row
gains per step (τ). The estimated speed-up of a drafter over plain decoding is then

    speedup = τ · t_plain / t_drafter

(tokens per second of each; this is E = (1 − α^{k+1}) / (1 − α) against the step's cost, both
measured where the drafter ran at this bucket). Times are per row because rows finish unevenly under speculation:
a drafter's steps at the end of a batch run with fewer rows than the bucket's plain steps, and whole
step times would make it look cheaper than it is (per row, such a step looks dearer where a step's
cost hardly depends on its rows, as on a GPU: the safe side). The controller

- knows what a token costs (`strategies/control/cost_model.py`): each step reports its forward's width (new
  tokens per row, 1 + the widest draft) and time, so the controller keeps the target's forward
  time per row by bucket and width, and each drafter's host time (step − forward: drafting,
  acceptance, bookkeeping) per bucket and width. At a bucket where plain steps ran but a drafter has
  not, the drafter's step costs the forward at its width there plus its host time from the nearest bucket,
  not another bucket's step ratio: a draft nearly free at batch 1 costs 2.4 plain steps at batch 8.
  A step so modelled is weighed against a plain step modelled alike, the forward at width 1 now
  (`_plain_row_s`), not the plain steps' own times, which keep samples of earlier prompts;
- never plans a drafter at a bucket where even its best case loses: every draft token accepted
  (1 + k tokens for a draft of k) at the cost of the forward at width 1 + k plus its known host
  time, against a plain step, not above 1 + h. It says so once per bucket, in an event of scope
  `explore`;
- explores each option for a few steps (plain steps at every batch size; a drafter once, for
  `explore_steps` steps and `explore_rows` row steps, or one step holding both, at a large batch, or
  only `explore_steps` where even its estimate raised by its spread loses to plain steps and the
  current choice, unless it learns, `_written_off`;
  its cost at a batch size it has not run at modelled as above), cheapest first (its first step
  teaches the model what a wider forward costs there, and drafters whose best case then loses are
  never tried; one at a time: a narrower drafter does not cut in while the budget refills for one
  whose exploration has begun), and only while what exploring steps lost against plain steps over
  the tokens their slower half of rows emitted, as τ counts them (a step's time beyond theirs, and
  the drafter's start when it started it: a draft model's prefill of the batch) is at most
  `explore_budget` (3%) of the decode time so far (the step about to run counts, as it may lose all
  but a plain step's worth, and its start as the last ones took; one wider than any measured at its bucket
  as dear as forwards of the widest measured width laid side by side, as many plain steps as its
  width where only plain steps ran): a cold job pays for exploration as it decodes. Then it follows
  the best estimate, with hysteresis: speculation goes off when the best falls below 1 − h and comes
  back above 1 + h, on or over to another drafter only right after that drafter ran (fresh evidence: 2-core
  step times drift, and an old measurement of a drafter against a fresh one of plain steps would
  switch on noise); a drafter that pays gives way to another only on that one's estimate shrunk
  toward 1 by the row steps it rests on (`evidence_rows`: at batch 1, a few steps are one prompt's
  luck, and the next prompt is another);
- probes an option it is not using again after a wait sized so that probes cost at most
  `probe_budget` of the time in all (each option an equal share; a probe costs the option's step
  time times the share of speed it would lose against the current choice, plus starting it again
  where it does not learn, `_resume_cost`: a draft model's prefill in a new batch; beside another
  drafter at its estimate raised by its spread over the rows it rests on, `_hopeful`), never sooner than
  `probe_every` steps nor later than `max_probe_wait`: no choice is permanent, and a hopeless one
  costs little. A drafter whose estimate so raised beats the current choice's by more than the
  hysteresis, on too few row steps to switch to it, is on trial instead: it runs step after step until
  its evidence switches to it or its raised estimate falls back (a Lookahead first explored with a
  cold trie, then probed at 2.0x beside prompt lookup's 1.8x, gathered one row step per probe and was
  never chosen). The rows an estimate rests on are those it was measured over, but for a drafter that
  learns from what every row emits (a Lookahead trie, `DraftLimits.learns`) they halve every
  `idle_half_life_rows` row steps decoded while it does not run, and its τ's average forgets as
  much (`_evidence`): what it was measured at while cold is asked again. Options are weighed before
  probes run, so that a switch rests on the step just taken;
- turns drafting off for a row whose drafts were rejected `row_patience` steps in a row, for
  `row_cooldown` steps, when the batch has other rows;
- sizes drafts per batch for the most tokens per second: where the cost model covers the plan's
  bucket, a chain's length k maximises E(k) / t(k), E from the acceptance per position α measured
  over the last `resize_rows` drafted row steps and t(k) the modelled step at width 1 + k; a
  tree's budget is the best of the learned one and its halvings by τ(n) / t(n), τ kept per budget
  asked for, each leaning on what the others say of it while it rests on few or old row steps
  (`cost_model.tree_tau_by_budget`, `_tree_evidence`). The learned sizes
  move as before, and size drafts where the model does not cover the bucket: chains one token at
  a time toward the best length (by the model's costs, else a draft token's measured cost c in
  plain steps, E(k) / (1 + c·k)); trees double their node budget (up to the strategy's) while a
  node yields at least twice what it costs (accepted tokens per node against the measured cost of
  a node, both in plain steps) and halve it while it yields less than it costs.

Every switch is an event (scope, from, to, reason, estimates) that the worker logs. It lives as
long as its actor, so what it learned carries over from batch to batch; across jobs, what it
learned (`Learned`) is saved at the end of a job and warm-starts the next job's controllers
(`workers/common/controller_stats.py`), which then explore only what it does not cover. A drafter known only
from such statistics is probed once, as soon as it is the best estimate, before speculation goes on
with it: a switch still needs a fresh measurement of its drafter.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strategies.control.cost_model import (
    ForwardCosts,
    RecentTime,
    best_case_speedup,
    best_chain_depth,
    best_tree_budget,
    host_cost,
    monotone_fit,
    segment_ends,
    tree_tau_by_budget,
)
from strategies.verification.control import AUTOREGRESSIVE, DraftLimits, Plan, StepRecord

BEST_CASE_STEPS = 16  # steps a drafter's best case at a bucket is kept (`AdaptiveController.best_case`)


@dataclass(frozen=True)
class ControllerSettings:
    smoothing: float = 0.3  # weight in τ's moving average of a step over `smoothing_rows` rows
    # A step over fewer rows weighs less. At batch 1 each batch is one prompt, and the next prompt is not
    # like this one: τ averages over a few prompts (some 200 row steps), not over this prompt's luck.
    smoothing_rows: int = 64
    # Step times: the mean of this many recent measurements, outliers left out (a drafter's step ratios:
    # at least this many, `_row_window`).
    time_window: int = 9
    hysteresis: float = 0.05
    explore_steps: int = 2  # plain steps measured per bucket, and steps per drafter, before estimates count
    explore_rows: int = 8  # row steps per drafter, too: at batch 1, two steps are two tokens' luck
    probe_every: int = 24  # fewest steps between probes of one option
    max_probe_wait: int = 2048  # most steps between probes of one option
    probe_budget: float = 0.005  # share of the time all probes together may lose
    # A row step's gain over its drafter's mean gain, spread (standard deviation over mean), for how far
    # an estimate on n row steps may lie below the drafter's worth: `probe_spread` / √n (`_hopeful`).
    # Measured under `auto` at batch 1 on HumanEval: 0.60-0.76 for Lookahead, 0.75-0.89 prompt lookup.
    probe_spread: float = 0.8
    row_patience: int = 4
    row_cooldown: int = 16
    min_tree_nodes: int = 4
    # Row steps of a tree drafter at other budgets that halve what τ at a budget rests on
    # (`_tree_evidence`): at batch 1, a pass over 16 HumanEval prompts is some 400.
    tree_half_life_rows: int = 512
    # Row steps decoded while a drafter that learns from what is emitted (a Lookahead trie) does not run
    # that halve the evidence behind its estimate (`_evidence`): its τ rises while it is idle.
    idle_half_life_rows: int = 512
    # Drafted row steps between draft-size decisions: at batch 1, 16 were a quarter of one prompt, and a
    # chain sized on them swung to a single token on a prompt that copied little.
    resize_rows: int = 64
    learn_above: float = 0.85  # a learning drafter sees batches while its estimate is above this
    explore_budget: float = 0.03  # share of the decode time that exploring steps which lose may take
    # A drafter that pays gives way to another only on that one's estimate shrunk toward 1 by the row
    # steps it was measured over, n / (n + evidence_rows): a few steps of one prompt are its luck.
    evidence_rows: int = 64
    # A drafting choice and its draft sizes stand this many row steps (at batch 1, 8 steps) before every
    # option is weighed again: the estimates move over hundreds of row steps, and weighing eight drafters
    # costs some 0.2 ms, a tenth of a plain step at batch 1 (sizing one again, some 0.1 ms).
    replan_rows: int = 8


@dataclass
class Ema:
    """A moving average that is a plain mean of its first measurements, until the moving weight is the
    larger: a first unlucky step must not stand for many steps."""

    value: float = 0.0
    seen: float = 0.0  # measurements so far, each counted by its share of a full weight

    def update(self, x: float, weight: float, share: float = 1.0) -> None:
        self.seen += share
        weight = max(weight, share / self.seen)
        self.value = (1 - weight) * self.value + weight * x


@dataclass
class Learned:
    """What a controller learned that outlives its actor: step times by (option, batch bucket), each
    drafter's τ, steps and row steps measured per option, draft sizes, and the cost model's forward
    times by (batch bucket, width) and host times by (drafter, batch bucket, width). Plain steps and plain
    forwards are kept in seconds, every other time as its ratio to a plain step's when it ran. Nothing
    in it decides a token: it only decides which lossless option runs and how long its drafts are."""

    row_time: dict[tuple[str, int], tuple[list[float], int]] = field(default_factory=dict)  # recent, count
    tau: dict[str, tuple[float, float]] = field(default_factory=dict)  # value, seen
    measured: dict[str, tuple[int, int]] = field(default_factory=dict)  # steps, row steps
    depth: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)
    forward_time: dict[tuple[int, int], tuple[list[float], int]] = field(default_factory=dict)  # (bucket, width)
    # (drafter, bucket, width)
    host_time: dict[tuple[str, int, int], tuple[list[float], int]] = field(default_factory=dict)


@dataclass
class RowDrafting:
    """What the controller keeps of one batch row: its drafts rejected in a row, and the step until which
    its drafting is off (`row_patience`, `row_cooldown`)."""

    streak: int = 0
    off_until: int = 0


def _slower_half_gain(accepted: list[int]) -> float:
    """Tokens a step moved its batch's end by: the mean gain of its slower half of rows. A batch ends with
    its slowest rows: a drafter that speeds up half the rows leaves the other half to tail steps that cost
    about as much as full ones."""
    gained = sorted(a + 1 for a in accepted)[: max(1, len(accepted) // 2)]
    return sum(gained) / len(gained)


def bucket(batch_size: int) -> int:
    """Batch sizes share statistics within powers of two."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class AdaptiveController:
    settings: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        # (option, bucket) -> seconds per row-step of plain steps; a drafter's over a plain row-step's
        # when it ran (the machine's speed drifts: ratios hold, see `host_time`).
        self.row_time: dict[tuple[str, int], RecentTime] = {}
        self.tau: dict[str, Ema] = {}
        self.depth: dict[str, int] = {}
        self.nodes: dict[str, int] = {}
        self.resize_tally: dict[str, list[int]] = {}
        self.measured: dict[str, tuple[int, int]] = {}  # option -> steps and row steps measured
        # Estimates by (what, option, bucket), until the next measurement: a plan asks for them many times.
        self.memo: dict[tuple[str, str, int], object] = {}
        self.limits: dict[str, DraftLimits] = {}
        self.current = AUTOREGRESSIVE
        self.step = 0  # steps observed
        self.row_steps = 0  # row steps observed, of every option
        # A learning drafter -> the row steps its estimate rests on (`_evidence`), and `row_steps` then.
        self.evidence: dict[str, tuple[float, int]] = {}
        self.last_used: dict[str, int] = {}
        self.events: list[dict] = []
        self.failed: set[str] = set()
        self.rows: list[RowDrafting] = []  # per batch row, in batch order (`keep_rows`, `add_rows`)
        self.forward = ForwardCosts(self.settings.time_window)  # the target's forward by bucket and width
        # (drafter, bucket, width) -> step − forward, per row, over a plain step's time there when it ran
        # (as the cost model keeps wide forwards: the machine's speed drifts, ratios hold).
        self.host_time: dict[tuple[str, int, int], RecentTime] = {}
        # (drafter, bucket) -> a drafter that does not learn (`_learns`): what starting it took, per row over
        # a plain step's time, at each of its last steps after another option's (`_resume_cost`).
        self.resume_setup: dict[tuple[str, int], deque[float]] = {}
        self.alpha: dict[str, float] = {}  # a chain drafter's acceptance per position, at its last resize
        self.tree_tau: dict[str, dict[int, Ema]] = {}  # a tree drafter's τ by node budget asked for
        # (drafter, budget) -> the drafter's row steps measured (`measured`) when τ at that budget last moved
        self.tree_tau_at: dict[tuple[str, int], int] = {}
        self.planned_nodes: dict[str, int] = {}  # the node budget of each drafter's last plan
        self.exploring: str | None = None  # a drafter planned for a step that explores it
        self.exploring_s = 0.0  # time of every such step
        self.exploring_lost_s = 0.0  # what they lost: time beyond plain steps emitting their tokens, drafters' starts
        self.decode_s = 0.0  # time of all steps
        self._drained = (0.0, 0.0, 0.0)  # (exploring_s, exploring_lost_s, decode_s) at the last `drain_exploring`
        # (drafter, bucket) -> step, basis and value (`_kept`) of `best_case` and `_step_costs`
        self.best_cases: dict[tuple[str, int], tuple[int, tuple, float]] = {}
        self.step_costs: dict[tuple[str, int], tuple[int, tuple, list[float]]] = {}
        self.hopeless: set[tuple[str, int]] = set()  # (drafter, bucket) whose best case loses, told in an event
        # (batch size, step, plan): the current drafter's plan stands until that step at that batch size
        self.standing: tuple[int, int, Plan] | None = None

    # -- the Controller protocol ---------------------------------------------------------------

    def start_batch(self, drafters: dict[str, DraftLimits], batch_size: int) -> None:
        self.limits = dict(drafters)
        self.memo.clear()
        self.standing = None
        for name, limits in drafters.items():
            start = limits.max_depth if limits.start_depth is None else limits.start_depth
            # Sizes learned under other limits (another job's, `warm_start`) are kept within these.
            self.depth[name] = min(self.depth.get(name, start), limits.max_depth)
            if limits.trees:
                self.nodes[name] = min(self.nodes.get(name, limits.max_nodes), limits.max_nodes)
            else:
                self.nodes[name] = self.depth[name]
        self.failed = set()
        if self.current not in self.limits:
            self.current = AUTOREGRESSIVE
        self.rows = [RowDrafting() for _ in range(batch_size)]

    def plan(self, batch_size: int) -> Plan:
        b = bucket(batch_size)
        if self.standing is not None and self.standing[0] == batch_size and self.step < self.standing[1]:
            # Its sizes too: weighing them again costs about what weighing the options does (0.1 ms).
            return dataclasses.replace(self.standing[2], rows_off=self._rows_off())
        self.standing = None
        options = [AUTOREGRESSIVE, *(o for o in self.limits if o not in self.failed and self._may_pay(o, b))]
        if self.current not in options:
            self._event("batch", self.current, AUTOREGRESSIVE, "its best case loses to plain steps", batch_bucket=b)
            self.current = AUTOREGRESSIVE
        if self._unexplored(AUTOREGRESSIVE, b):
            return self._plan_for(AUTOREGRESSIVE, b)
        # One at a time, cheapest first: the first steps of cheap drafters teach the cost model what dear
        # ones would cost, and a drafter whose exploration is finished can be chosen while the budget
        # refills for the next (one that has not run yet, its host time unknown, only looks cheaper). A
        # narrower one does not cut in while the budget refills: traced cold at batch 1, blockwise and a
        # draft model's start did, between prompt lookup's first exploring step and its next, and used
        # the budget that would have let prompt lookup, paying, be chosen 350 steps sooner.
        unexplored = sorted(
            (o for o in options[1:] if self._unexplored(o, b)),
            key=lambda o: (o not in self.measured, self._step_cost(o, b)),
        )
        if unexplored and self._explore_wait(unexplored[0], b, batch_size) == 0:
            return self._plan_for(unexplored[0], b, exploring=True)
        unconfirmed = self._unconfirmed_best(options, b)
        if unconfirmed is not None:
            return self._plan_for(unconfirmed, b)
        # Weighed before probes: a switch rests on the step just taken (`_choose`), and a probe of another
        # option in between would take that step's freshness away. Traced at batch 1, a Jacobi trial's
        # steps fell after each probe of Lookahead, which had read 2.7x beside prompt lookup's 1.4x for 240
        # steps, and kept it from being chosen.
        self._choose(options, b)
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

    def worth_learning(self, drafter: str, batch_size: int) -> bool:
        """A drafter whose estimate is unknown or near break-even may win once it has learned more
        (a cold Lookahead trie drafts little); one far below it is not fed batches it would not serve."""
        estimate = self.speedup(drafter, bucket(batch_size))
        return estimate is None or estimate >= self.settings.learn_above

    def observe(self, record: StepRecord) -> None:
        s = self.settings
        b = bucket(record.batch_size)
        self.step += 1
        row_time = record.wall_s / record.batch_size
        plain = self.row_time.get((AUTOREGRESSIVE, b))
        key = (record.drafter, b)
        if record.drafter == AUTOREGRESSIVE:
            self.row_time.setdefault(key, RecentTime(self._row_window(key))).update(row_time)
        elif plain is not None:  # plain steps run first at every bucket: a drafter's has one to relate to
            self.row_time.setdefault(key, RecentTime(self._row_window(key))).update(row_time / plain.value)
        self.decode_s += record.wall_s + record.setup_s
        drafting = record.drafter != AUTOREGRESSIVE
        gain = _slower_half_gain(record.accepted) if drafting else 1.0  # a plain step moves every row by one
        resumed = self.last_used.get(record.drafter) != self.step - 1
        if drafting and resumed and plain is not None and not self._learns(record.drafter):
            setups = self.resume_setup.setdefault(key, deque(maxlen=s.time_window))
            setups.append(record.setup_s / record.batch_size / plain.value)
        if record.drafter == self.exploring:
            # A step exploring a drafter loses what it took beyond plain steps moving the batch's end as far
            # (its slower half's tokens, as τ counts them: the faster rows' extra tokens leave the batch to
            # end as late), and starting the drafter for it (a draft model's prefill of the batch: ten plain
            # steps at batch 8); one that paid lost nothing. Counted whole, a step of prompt lookup that
            # found no match, a plain step but for some microseconds, cost the budget a plain step: traced
            # cold at batch 1, its eight exploring steps took 296 steps, plain all but those eight, before
            # it could be chosen.
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
        aged, evidence = self._aged(record.drafter), self._evidence(record.drafter)
        steps, rows = self.measured.get(record.drafter, (0, 0))
        self.measured[record.drafter] = (steps + 1, rows + record.batch_size)
        self.row_steps += record.batch_size
        self.memo.clear()
        self.last_used[record.drafter] = self.step
        if record.drafter == AUTOREGRESSIVE:
            return
        if self._learns(record.drafter):
            self.evidence[record.drafter] = (evidence + record.batch_size, self.row_steps)
            if record.drafter in self.tau:  # what it was measured at while idle counts as the evidence does
                self.tau[record.drafter].seen *= aged
        share = min(1.0, len(record.accepted) / s.smoothing_rows)
        weight = 1 - (1 - s.smoothing) ** share
        self.tau.setdefault(record.drafter, Ema()).update(gain, weight, share)
        if self.limits.get(record.drafter, DraftLimits(0, 0)).trees:
            budget = self.planned_nodes.get(record.drafter, max(record.drafted))
            ema = self.tree_tau.setdefault(record.drafter, {}).setdefault(budget, Ema())
            ema.seen = self._tree_evidence(record.drafter, budget, ema)  # what it has seen since counts more
            ema.update(gain, weight, share)
            self.tree_tau_at[(record.drafter, budget)] = self.measured[record.drafter][1]
        self._resize(record)
        self.memo.clear()  # sizes may have changed
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
        self.measured = dict(learned.measured)
        self.depth, self.nodes = dict(learned.depth), dict(learned.nodes)
        self.memo.clear()

    def time_forwards(self, batch_size: int, seconds_by_width: dict[int, list[float]]) -> None:
        """Forwards timed before decoding (an actor's start, `workers.generator`): per width (new tokens
        per row, 1 among them), the seconds of forwards over `batch_size` rows. Without them a cold
        controller prices a drafter's first step, wider than any forward it has run, as that many plain
        steps, and the exploration budget made a cold job at batch 1 decode hundreds of plain steps
        before its first draft."""
        b = bucket(batch_size)
        for width in sorted(seconds_by_width):  # the plain forward first: wider ones are kept as ratios to it
            for seconds in seconds_by_width[width]:
                self.forward.observe(b, width, seconds / batch_size)
        self.memo.clear()

    def drafter_failed(self, drafter: str, reason: str) -> None:
        self.failed.add(drafter)
        self.standing = None
        if self.current == drafter:
            self.current = AUTOREGRESSIVE
        self._event("batch", drafter, AUTOREGRESSIVE, reason)

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[b] for b in rows]

    def add_rows(self, count: int) -> None:
        self.rows += [RowDrafting() for _ in range(count)]

    # -- policy ---------------------------------------------------------------------------------

    def speedup(self, drafter: str, b: int) -> float | None:
        """Estimated tokens/s of `drafter` over plain decoding at batch bucket `b` (None: unmeasured)."""
        if drafter == AUTOREGRESSIVE:
            return 1.0
        tau, ratio = self.tau.get(drafter), self.cost_ratio(drafter, b)
        if not tau or ratio is None:
            return None
        return tau.value / ratio

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
                step = self._step_row_s(option, b, 1 + self.draft_size(option, b)[1])
                ratio = step / plain if plain and step is not None else None
            elif measured:
                nearest = min(measured, key=lambda m: (abs(m.bit_length() - b.bit_length()), -m))
                ratio = self.row_time[(option, nearest)].value
            self.memo[("ratio", option, b)] = ratio
        return self.memo[("ratio", option, b)]

    def drain_events(self) -> list[dict]:
        events, self.events = self.events, []
        return events

    def drain_exploring(self) -> dict[str, float]:
        """Seconds since the last call of exploring steps (`exploring_s`), of what they lost against plain
        steps over their tokens (`exploring_lost_s`: what `explore_budget` limits) and of every step
        (`decoding_s`), each with the starts of drafters it paid for: the job adds up its actors' records."""
        now = (self.exploring_s, self.exploring_lost_s, self.decode_s)
        explored, lost, decoded = (a - b for a, b in zip(now, self._drained, strict=True))
        self._drained = now
        return {"exploring_s": round(explored, 6), "exploring_lost_s": round(lost, 6), "decoding_s": round(decoded, 6)}

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
        start of a job) ranks below one measured on hundreds. Traced cold at batch 1, Lookahead explored
        on five steps of the first prompt read below prompt lookup and was probed every few hundred steps
        for three passes, a row step each, while it ran 1.5x beside prompt lookup's 1.4x alone. Beside
        plain steps a probe's deficit is weighed as it is: where nothing pays, probing must stay cheap."""
        if AUTOREGRESSIVE in (option, self.current):
            return estimate
        return self._raised(option, estimate)

    def _raised(self, drafter: str, estimate: float) -> float:
        """`estimate` of `drafter` raised by its spread: `probe_spread` / √rows over the row steps it rests on."""
        return estimate * (1 + self.settings.probe_spread / math.sqrt(max(1.0, self._evidence(drafter))))

    def _on_trial(self, option: str, estimate: float, current_estimate: float) -> bool:
        """Whether drafter `option`, its estimate raised by its spread (`_hopeful`), beats the current
        drafter's by more than the hysteresis on too few row steps to switch to it (`_weighed`, as
        `_choose` weighs it): probed one step at a time it would gather a row step per probe at batch 1,
        never the hundreds a switch needs, so it runs at once instead, until its evidence switches to it
        or its raised estimate falls back (a few row steps where its estimate is what was measured).
        Traced cold at batch 1 over 16 HumanEval prompts, Lookahead was chosen over prompt lookup after a
        median of some 400 steps with trials on the estimate as measured, 120 on the raised one."""
        if AUTOREGRESSIVE in (option, self.current):  # plain steps turn speculation on unweighed
            return False
        bar = current_estimate * (1 + self.settings.hysteresis)
        return self._hopeful(option, estimate) > bar >= self._weighed(option, estimate)

    def _probe_due(self, option: str, b: int) -> bool:
        return self._since(option) >= self.probe_wait(option, b)

    def _since(self, option: str) -> int:
        """Steps since `option` last ran, counting the one about to be planned."""
        return self.step + 1 - self.last_used.get(option, 0)

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

    def _written_off(self, drafter: str, b: int) -> bool:
        """Whether `drafter`, after `explore_steps` steps, is explored enough because even its estimate
        raised by its spread over the row steps behind it (`probe_spread` / √rows) stays below plain steps
        and the current choice: the rest of its exploring steps could not make it the choice, and
        probes ask again. Not a drafter that learns from every row (a Lookahead trie): its first steps
        run cold. At batch 1 each drafter explored for all 8 row steps: a self-speculative step cost
        some 5.5 plain steps, at 0.6x after two of them."""
        if self.measured.get(drafter, (0, 0))[0] < self.settings.explore_steps or self._learns(drafter):
            return False
        return self._raised(drafter, self.speedup(drafter, b)) < max(1.0, self.speedup(self.current, b) or 1.0)

    def _measured_enough(self, drafter: str) -> bool:
        """Whether `drafter` has run the steps and row steps that exploring asks for, anywhere."""
        s = self.settings
        steps, rows = self.measured.get(drafter, (0, 0))
        # At a large batch one step holds the row steps of several: it is enough on its own.
        return rows >= s.explore_rows and (steps >= s.explore_steps or rows >= s.explore_steps * s.explore_rows)

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

    def _may_pay(self, drafter: str, b: int) -> bool:
        """Whether `drafter` may be planned at bucket `b`: not when even its best case would not switch
        speculation on (said once per bucket, in an event), by the forward's cost, or by its own host time
        once that rests on a full exploration."""
        best, h = self.best_case(drafter, b), self.settings.hysteresis
        if best is None or best > 1 + h:
            return True
        if not self._measured_enough(drafter) and (self._best_case(drafter, b, with_host=False) or 0) > 1 + h:
            # Only its own host time rules it out, measured on a step or two, and a first one pays for
            # one-time work (Lookahead counts a row's prompt at its first proposal: traced, 0.18x from one
            # step at batch 1, which kept it out for passes): it is explored in full first.
            return True
        if (drafter, b) not in self.hopeless:
            self.hopeless.add((drafter, b))
            reason = f"best case {best:.2f} <= {1 + self.settings.hysteresis:.2f}: never planned at this batch size"
            self._event("explore", drafter, AUTOREGRESSIVE, reason, batch_bucket=b)
        return False

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

    def _host_row_s(self, drafter: str, b: int, width: int) -> float | None:
        """A step's seconds per row besides the forward for `drafter` at bucket `b`, `width` wide, from
        `_host_curve` (`cost_model.host_cost`); None: not measured yet."""
        curve = self._host_curve(drafter, b)
        return None if curve is None else host_cost(curve, width, self.limits[drafter].per_depth)

    def _plain_row_s(self, b: int) -> float | None:
        """A plain step's seconds per row at bucket `b` by the cost model, what its modelled drafting steps
        (`_step_row_s`) are weighed against: the forward at width 1 (a plain step's host work, choosing
        and emitting a token, measured 0.5% of it at batch 1). Not the plain steps' own `row_time`: the
        forward's last few samples follow the context length of the prompts now decoding, while plain
        steps, rare once a drafter runs, keep samples of earlier prompts. Over prompts 1.5 and 2.3 ms a
        forward apart, the two gave drafts of 1 to 2 tokens 0.8 plain steps, where they cost 1.13-1.16,
        and prompt lookup under the controller drafted on matches that did not pay. None: plain steps
        have not run at `b` (a drafter's host times are kept as ratios to theirs), or no forward was timed."""
        if (AUTOREGRESSIVE, b) not in self.row_time:
            return None
        return self.forward.row_seconds(b, 1)

    def _step_row_s(self, drafter: str, b: int, width: int) -> float | None:
        """Seconds per row of a step of `drafter` at bucket `b` whose forward is `width` tokens wide, by the
        cost model (its host time taken as none until measured); None: the model does not cover `b`."""
        forward = self.forward.row_seconds(b, width)
        return None if forward is None else forward + (self._host_row_s(drafter, b, width) or 0.0)

    def _step_cost(self, drafter: str, b: int) -> float:
        """The cheapest step of `drafter` at `b` (one draft token), for exploring cheapest first; 0 if unknown."""
        return self._step_row_s(drafter, b, 2) or 0.0

    def _explore_wait(self, drafter: str, b: int, batch_size: int) -> int:
        """Plain steps to run before a step exploring `drafter` fits in `explore_budget` of the decode time:
        what exploring steps lost against plain steps (`exploring_lost_s`) and what this one may lose (its
        time beyond the plain step that emits each row's own token, and its start as `_resume_cost` has
        seen it), against all steps' time; 0: it fits now, or its cost is unknown. Probes are not counted
        here: `probe_budget` bounds what they lose."""
        budget = self.settings.explore_budget
        width = 1 + self.draft_size(drafter, b)[1]
        step = self._step_row_s(drafter, b, width)
        if step is None:
            return 0
        plain = self.row_time[(AUTOREGRESSIVE, b)].value
        widest = self.forward.widths(b)[-1]
        if width > widest:  # never this wide here: no dearer than forwards of the widest, side by side
            bound = self.forward.row_seconds(b, widest) * math.ceil(width / widest)
            step = max(step, bound + (self._host_row_s(drafter, b, width) or 0.0))
        step *= batch_size
        may_lose = max(0.0, step - plain * batch_size) + self._resume_cost(drafter, b) * plain * batch_size
        deficit = (self.exploring_lost_s + may_lose) / budget - step - self.decode_s
        if deficit <= 0:
            return 0
        return math.ceil(deficit / (plain * batch_size))

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

    def _choose(self, options: list[str], b: int) -> None:
        h = self.settings.hysteresis
        estimates = {o: self.speedup(o, b) for o in options}
        drafters = [o for o in options if o != AUTOREGRESSIVE and estimates[o] is not None]
        # Ranked on the estimates weighed by the row steps behind them: eight rows at 1.8x are one
        # prompt's luck beside a thousand at 1.5x.
        best = max(drafters, key=lambda o: self._weighed(o, estimates[o]), default=AUTOREGRESSIVE)
        best_gain = estimates[best] or 1.0
        current_gain = estimates.get(self.current) or 1.0
        if self.current == AUTOREGRESSIVE:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {best_gain:.2f} > {1 + h:.2f}"
        elif current_gain < 1 - h:
            target = best if best_gain > 1 + h else AUTOREGRESSIVE
            reason = f"estimated speed-up {current_gain:.2f} < {1 - h:.2f}"
        elif best != self.current and self._weighed(best, best_gain) > current_gain * (1 + h):
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

    def _row_window(self, key: tuple[str, int]) -> int:
        """Measurements kept of `row_time[key]` ((option, bucket)): `time_window` of plain steps; of a
        drafter's step ratio, as many row steps as τ's moving average spans (a plain mean as old on
        average as its weights), at least `time_window`. A drafter's steps are of two kinds, a verify
        when it drafted and a plain step when it found nothing, in streaks: against τ's long average,
        a short window of times made the estimate swing with the kind of the last few steps (prompt
        lookup at batch 1: 0.94x to 1.75x, while it ran 1.3x)."""
        s = self.settings
        option, b = key
        if option == AUTOREGRESSIVE or s.smoothing >= 1:
            return s.time_window
        rows = 2 * s.smoothing_rows / -math.log(1 - s.smoothing)
        return max(s.time_window, math.ceil(rows / b))

    def _weighed(self, drafter: str, estimate: float) -> float:
        """`estimate` of `drafter` shrunk toward 1 (plain decoding) by the evidence behind it: the row
        steps it was measured over (`evidence_rows`)."""
        rows = self._evidence(drafter)
        return 1 + (estimate - 1) * rows / (rows + self.settings.evidence_rows)

    def _resume_cost(self, drafter: str, b: int) -> float:
        """What running `drafter` again at bucket `b` after another option costs in starting it, in plain
        steps: the mean of its last such steps' starts (a draft model's prefill of its rows, when a probe
        falls in a new batch), 0 until one is seen. A drafter that learns from every row (a Lookahead trie)
        pays its counting wherever it runs, as learning: not counted. Probes of a draft model at batch 1,
        each a new prompt, started it at some 2.5 plain steps a probe, weighed at none."""
        setups = self.resume_setup.get((drafter, b))
        return math.fsum(setups) / len(setups) if setups else 0.0

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
        each counted as `_aged` says. Traced at batch 1 under `auto`, Lookahead was measured on a cold trie
        in the job's first steps, below prompt lookup; its trie went on learning from what prompt lookup
        emitted, and its estimate, resting on those first steps, kept it idle for 850 steps."""
        if not self._learns(drafter):
            return self.measured.get(drafter, (0, 0))[1]
        rows = self.evidence[drafter][0] if drafter in self.evidence else self.measured.get(drafter, (0, 0))[1]
        return rows * self._aged(drafter)

    def draft_size(self, drafter: str, b: int | None = None) -> tuple[int, int]:
        """The (depth, nodes) the next step of `drafter` asks for, within its limits. Where the cost model
        covers bucket `b`: the most tokens per second there, a chain's length from its acceptance per
        position (E(k) against the step's cost at width 1 + k), a tree's budget (at most the learned one)
        from τ by budget (`tree_tau_by_budget`). Otherwise the size learned by `_resize`."""
        if b is None or not self.forward.covers(b):
            return self.depth[drafter], self.nodes[drafter]
        if ("size", drafter, b) not in self.memo:
            self.memo[("size", drafter, b)] = self._modelled_size(drafter, b)
        return self.memo[("size", drafter, b)]

    def _modelled_size(self, drafter: str, b: int) -> tuple[int, int]:
        depth, nodes = self.depth[drafter], self.nodes[drafter]
        limits = self.limits[drafter]
        if limits.trees:
            s = self.settings
            # Row steps behind each budget's τ: an `Ema` counts a step of r rows as r / smoothing_rows.
            tried = {
                n: (ema.value, self._tree_evidence(drafter, n, ema) * s.smoothing_rows)
                for n, ema in self.tree_tau.get(drafter, {}).items()
            }
            smallest = min(s.min_tree_nodes, limits.max_nodes)
            budgets = [nodes >> halvings for halvings in range(nodes.bit_length()) if nodes >> halvings >= smallest]
            if not tried or not budgets:
                return depth, nodes
            costs = {n: self._step_row_s(drafter, b, 1 + n) for n in budgets}
            return depth, best_tree_budget(tree_tau_by_budget(tried, budgets, s.evidence_rows), costs)
        if drafter not in self.alpha or limits.sizes_own:
            return depth, nodes
        costs = [self._step_row_s(drafter, b, 1 + k) for k in range(1, limits.max_depth + 1)]
        best = best_chain_depth(self.alpha[drafter], costs)
        return best, best

    def _tree_evidence(self, drafter: str, budget: int, ema: Ema) -> float:
        """What τ of tree drafter `drafter` at node budget `budget` has seen (`Ema.seen`), halved every
        `tree_half_life_rows` row steps the drafter ran at other budgets since: a learning drafter's τ
        moves (a Lookahead trie fills), and a budget last measured while it was cold must be measured
        again (`cost_model.tree_tau_by_budget` then leans on what the others say of it)."""
        since = self.measured.get(drafter, (0, 0))[1] - self.tree_tau_at.get((drafter, budget), 0)
        return ema.seen * 0.5 ** (since / self.settings.tree_half_life_rows)

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

    def _resize(self, record: StepRecord) -> None:
        """Size drafts on the last `resize_rows` drafted row steps (one step at batch 1 is one row's luck)."""
        name = record.drafter
        tally = self.resize_tally.setdefault(name, [0, 0, 0, 0])  # row steps, drafted, accepted, rejections
        for drafted, accepted in zip(record.drafted, record.accepted, strict=True):
            if drafted:
                tally[0] += 1
                tally[1] += drafted
                tally[2] += accepted
                tally[3] += accepted < drafted
        if tally[0] < self.settings.resize_rows:
            return
        row_steps, drafted, accepted, rejections = tally
        self.resize_tally[name] = [0, 0, 0, 0]
        limits = self.limits[name]
        b = bucket(record.batch_size)
        ratio = self.cost_ratio(name, b)
        nodes = self.nodes[name]  # a chain's nodes are its depth
        node_cost = max(0.0, (ratio - 1) / nodes) if ratio is not None else 0.0  # in plain steps
        if limits.trees:  # double or halve on what a node yields against what it costs
            yield_per_node = accepted / drafted  # accepted tokens, each a plain step saved
            # The nodes a change adds or drops are the tree's least likely: twice the cost to grow.
            if yield_per_node >= 2 * node_cost:
                self.nodes[name] = min(limits.max_nodes, nodes * 2)
            elif yield_per_node < node_cost:
                self.nodes[name] = max(min(self.settings.min_tree_nodes, limits.max_nodes), nodes // 2)
            return
        if limits.sizes_own:  # its usual draft length, which its costing assumes (`draft_size`)
            self.depth[name] = self.nodes[name] = min(limits.max_depth, max(1, round(drafted / row_steps)))
            return
        # A chain: one step toward the depth with the most tokens per unit of step cost.
        depth = self.depth[name]
        self.alpha[name] = accepted / (accepted + rejections)
        costs = [self._step_row_s(name, b, 1 + k) or 1 + node_cost * k for k in range(1, limits.max_depth + 1)]
        best = best_chain_depth(self.alpha[name], costs)
        self.depth[name] = depth + (best > depth) - (best < depth)
        self.nodes[name] = self.depth[name]

    def _event(self, scope: str, source: str, target: str, reason: str, **details) -> None:
        self.events.append(
            {"scope": scope, "from": source, "to": target, "reason": reason, "step": self.step, **details}
        )

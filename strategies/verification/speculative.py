"""Draft, then verify: the decoding loop shared by every proposer, for chains and trees alike.

Each step: a drafter's proposer drafts below every row's pending token; the verifier
(`strategies.verification.verify`) checks all rows in one target forward with the drafter's acceptance rule
and rolls the rejected slots back, so rows of one step keep different numbers of tokens. Proposers
that draft from the target's own states receive them after every forward. Emitted tokens go through the
same finish checks as autoregressive decoding, one at a time, so EOS, stop strings,
`max_new_tokens` and the context end a row exactly where plain decoding would.

With a controller (`control.Controller`), each step may use any of several drafters or none, and
rows whose drafts keep failing step plainly. Steps without drafts are the autoregressive strategy's
own (`batch.decode_plainly`), run for as many steps as the controller's plan allows. Faults are
fallbacks: a proposer that raises is off for the rest of the batch; a verify forward that raises (a
CUDA out-of-memory error, say) leaves every row's cache as it was, and the step is redone plainly.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, Segment, decode_to_end
from strategies.constraints.drafts import prune, with_forced
from strategies.runtime.batch import PLAIN_RUN_STEPS, Batch, Row, decode_plainly, start_batch
from strategies.runtime.runner import ModelRunner
from strategies.runtime.target_states import TargetStates
from strategies.verification.control import AUTOREGRESSIVE, Controller, Plan, StepRecord
from strategies.verification.draft_controls import DraftControls
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft, draft_problem
from strategies.verification.metrics import SpecStats
from strategies.verification.proposer import ProposalContext
from strategies.verification.verify import Verification, verify


@dataclass(eq=False)
class _LoopRow(Row):
    """A row of the speculative loop: a batch's row, and the tokens it emitted under each option (a
    drafter's name, or autoregressive for plain steps; the prefill's token is not counted)."""

    by_option: Counter[str] = field(default_factory=Counter)


@dataclass
class _Decoding:
    """One batch in the speculative loop: its rows, its metrics and its drafters' state (a `Decoding`)."""

    strategy: SpeculativeStrategy
    batch: Batch
    live: dict[str, DraftingMethod]  # drafters not failed in this batch
    started: set[str] = field(default_factory=set)  # drafters started in this batch
    stats: SpecStats = field(default_factory=SpecStats)  # since the last segment

    def running(self) -> list[DraftingMethod]:
        """The live drafters that have started, as a list: a failing callback removes its drafter."""
        return [d for name, d in self.live.items() if name in self.started]

    def active(self) -> int:
        return len(self.batch.active)

    def step(self) -> None:
        self.strategy._step(self)

    def admit(self, requests: list[RowRequest]) -> None:
        self.strategy._admit(self, requests)

    def finished(self) -> list[tuple[int, RowOutput]]:
        return [(row.number, self.strategy._row_output(self, row)) for row in self.batch.finished_rows()]

    def segment(self) -> Segment:
        extra: dict = {}
        for d in self.running():
            extra.update(d.proposer.stats())
        stats, self.stats = self.stats, SpecStats()
        return Segment(stats.target_forwards, self.batch.take_generated(), {**stats.as_dict(), **extra})


class SpeculativeStrategy:
    """Speculative decoding with one drafter (a fixed strategy) or several under a controller (`auto`)."""

    def __init__(
        self,
        name: str,
        runner: ModelRunner,
        drafters: list[DraftingMethod],
        controller: Controller | None = None,
        keyed_samples_only: bool = False,
    ):
        if controller is None and len(drafters) != 1:
            raise ValueError("several drafters need a controller to choose among them")
        self.name = name
        self.runner = runner
        self.drafters = {d.name: d for d in drafters}
        self.options = [*self.drafters, AUTOREGRESSIVE]  # in the order a tie for a row's strategy goes
        self.controller = controller
        # At temperature > 0, only drafters whose rule emits the target's keyed samples (`auto`'s
        # `strategy.reproducible_sampling`): the others' rows decode with the rest, or plainly.
        self.keyed_samples_only = keyed_samples_only
        # The target's hidden states are kept (and, off the lean forward, computed) only for drafters
        # that read them; a verify forward's logits are handed on only to drafters that read them.
        self.want_hidden = any(d.proposer.wants_hidden_states for d in drafters)
        self.want_verify_logits = any(d.proposer.wants_verify_logits for d in drafters)

    def _samples(self, drafter: DraftingMethod) -> bool:
        """Whether `drafter` may draft rows decoded at temperature > 0."""
        return not drafter.greedy_only and (drafter.rule.keyed_samples or not self.keyed_samples_only)

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        return decode_to_end(self.name, self.open(requests, params), len(requests))

    def open(self, requests: list[RowRequest], params: GenerationParams) -> _Decoding:
        """Prefill the batch, tell the controller which drafters it may plan, and start those that
        learn from every batch. A drafter whose rule cannot verify at these settings fails the batch."""
        for d in self.drafters.values():
            refusal = d.rule.refusal(greedy=params.sampling.greedy, trees=d.trees)
            if refusal is not None:
                raise ValueError(f"{self.name}: {refusal}")
        run = _Decoding(
            strategy=self,
            batch=start_batch(self.runner, requests, params, self.want_hidden, _LoopRow),
            live={n: d for n, d in self.drafters.items() if params.sampling.greedy or self._samples(d)},
        )
        batch_size = len(run.batch.active)
        if not batch_size:
            return run
        if self.controller is not None:
            self.controller.start_batch({name: d.limits() for name, d in run.live.items()}, batch_size)
        # A drafter starts (prefills, indexes) when first planned: kept off, it costs nothing. One that learns from
        # every batch, or reads the target's features (later, it misses the prompt's), starts now if it may pay.
        for name, d in list(run.live.items()):
            early = d.learns or d.proposer.wants_hidden_states
            if early and (self.controller is None or self.controller.worth_learning(name, batch_size)):
                self._start(run, d)
        return run

    def _step(self, run: _Decoding) -> None:
        """One step as planned: draft and verify, or plain steps where nothing is drafted or it failed."""
        batch = run.batch
        plan = self._plan(run.live, len(batch.active))
        drafter = run.live.get(plan.drafter)
        setup_s = 0.0
        if drafter is not None and drafter.name not in run.started:
            starting = time.perf_counter()
            if not self._start(run, drafter):
                drafter = None
            setup_s = time.perf_counter() - starting
        if drafter is None:
            # Plain runs end within PLAIN_RUN_STEPS, so that waiting rows can join a batch with room.
            self._plain(run, min(plan.steps or PLAIN_RUN_STEPS, PLAIN_RUN_STEPS))
            return
        began = time.perf_counter()  # a batch's one start per drafter is not a step's cost
        context = ProposalContext(
            num_generated=[len(row.tokens) for row in batch.active],
            budgets=[
                0 if b in plan.rows_off else self._room(batch, row, plan.depth) for b, row in enumerate(batch.active)
            ],
            max_nodes=plan.nodes,
            keys=batch.keys,
            states=batch.states if drafter.proposer.wants_hidden_states else None,
            step_costs=plan.step_costs,
        )
        if not any(context.budgets):  # every row is off or at its end: nothing to ask the drafter
            self._plain(run, 1)
            return
        matchers = [row.matcher for row in batch.active]
        drafts = prune(matchers, self._drafts(run, drafter, context))
        if batch.params.sampling.greedy:  # a forced chain has no draft probabilities to sample against
            drafts = with_forced(matchers, drafts, [min(budget, context.max_nodes) for budget in context.budgets])
        began += drafter.proposer.setup_s  # once per row, as a start is
        setup_s += drafter.proposer.setup_s
        if not any(len(d) for d in drafts):  # nothing to verify: a plain step, at the drafter's cost
            self._plain(run, 1, billed_to=drafter.name, overhead_s=time.perf_counter() - began, setup_s=setup_s)
            return
        checked = self._speculate(run, drafter, drafts, context)
        if checked is None:  # the verify forward raised; the cache is as before the step
            self._plain(run, 1)
            return
        self._drafted(run, drafter.name, drafts, checked, began, setup_s)

    def _admit(self, run: _Decoding, requests: list[RowRequest]) -> None:
        """Rows join the batch (`Decoding.admit`): prefilled together, then known to the controller and to
        every drafter that has started, after the rows there are."""
        batch = run.batch
        joining = start_batch(self.runner, requests, batch.params, self.want_hidden, _LoopRow)
        contexts = [row.request.prompt + row.tokens for row in joining.active]
        states = joining.states
        batch.admit(joining)
        if not contexts:
            return
        if self.controller is not None:
            self.controller.add_rows(len(contexts))
        for d in run.running():
            self._call(run, d.name, d.proposer.add_rows, contexts, states if d.proposer.wants_hidden_states else None)

    def _row_output(self, run: _Decoding, row: _LoopRow) -> RowOutput:
        # A fixed strategy whose drafter could not run at all (greedy-only, sampling) decoded plainly.
        fixed = self.name if run.live or run.started else AUTOREGRESSIVE
        counts = row.by_option
        strategy = self._row_strategy(counts, fixed)
        by_option = {name: counts[name] for name in self.options if counts[name]}
        by_option[AUTOREGRESSIVE] = counts[AUTOREGRESSIVE] + 1  # the prefill's token too
        return RowOutput(row.tokens, row.reason, strategy, logprobs=row.scores, tokens_by_option=by_option)

    def _start(self, run: _Decoding, drafter: DraftingMethod) -> bool:
        """Start `drafter` on the active rows' contexts; one that raises is off for the batch."""
        run.started.add(drafter.name)
        batch = run.batch
        if drafter.proposer.shares_cache:  # self-speculation drafts in the target's cache
            drafter.proposer.use_cache(batch.kv)
        contexts = [row.request.prompt + row.tokens for row in batch.active]
        states = batch.states if drafter.proposer.wants_hidden_states else None
        return self._call(run, drafter.name, drafter.proposer.start, contexts, batch.params, states)

    def _speculate(
        self, run: _Decoding, drafter: DraftingMethod, drafts: list[Draft], context: ProposalContext
    ) -> Verification | None:
        """Verify the drafts in one target forward (`verify.verify`); None when it raised (a CUDA
        out-of-memory error, say): the cache is as before the step and the drafter is off for the batch."""
        batch = run.batch
        pending = [row.tokens[-1] for row in batch.active]
        try:
            checked = verify(
                self.runner,
                batch.kv,
                pending,
                drafts,
                drafter.rule,
                batch.params.sampling,
                batch.keys,
                context.num_generated,
                want_hidden=self.want_hidden,
                want_logits=self.want_verify_logits,
                controls=DraftControls.of(batch),
            )
        except Exception as exc:
            run.stats.fault(drafter.name, f"verify with {drafter.name}: {type(exc).__name__}: {exc}")
            if self.controller is not None:
                self.controller.drafter_failed(drafter.name, f"verify forward raised {type(exc).__name__}")
            run.live.pop(drafter.name, None)
            _free_device_memory(self.runner.device)
            return None
        if self.want_hidden:
            batch.states = checked.states
        return checked

    def _drafted(
        self, run: _Decoding, drafter: str, drafts: list[Draft], checked: Verification, began: float, setup_s: float
    ) -> None:
        """Emit a drafted step's tokens through the finish checks, one at a time, and report the step.
        Their scores come from the verify forward's logits at the slots that chose them."""
        batch, stats, verdicts = run.batch, run.stats, checked.verdicts
        stats.count_forwards(drafter, 1)
        emitted = [t for v in verdicts for t in v.tokens]
        scores = batch.score(checked.emitting_logits(), torch.tensor(emitted)) if batch.keeps_scores else None
        still, first = [], 0
        for b, (row, draft, verdict) in enumerate(zip(batch.active, drafts, verdicts, strict=True)):
            stats.record(drafter, draft, verdict)
            for j, token in enumerate(verdict.tokens):
                row.by_option[drafter] += 1
                if batch.emit(row, token, scores[first + j] if scores is not None else None):
                    break
            first += len(verdict.tokens)
            if row.reason is None:
                still.append(b)
        drafted, accepted = [len(d) for d in drafts], [len(v.accepted_slots) for v in verdicts]
        wall_s, width = time.perf_counter() - began, 1 + max(drafted)
        record = StepRecord(
            drafter,
            len(batch.active),
            wall_s,
            drafted,
            accepted,
            width,
            checked.forward_s,
            setup_s,
            checked.computed_width,
        )
        self._after_step(run, [v.tokens for v in verdicts], still, [record], checked.states)

    def _plain(
        self,
        run: _Decoding,
        max_steps: int | None,
        billed_to: str | None = None,
        overhead_s: float = 0.0,
        setup_s: float = 0.0,
    ) -> None:
        """Plain steps, the autoregressive strategy's own (`batch.decode_plainly`). The controller sees
        each as a plain step, or, after a drafter that found nothing to draft (`billed_to`), as that
        drafter's step, its drafting time (`overhead_s`) included: steps where it finds nothing are
        part of what the drafter is worth; `setup_s`: what starting it for this step took."""
        active = run.batch.active
        steps = decode_plainly(self.runner, run.batch, max_steps)
        run.stats.count_forwards(AUTOREGRESSIVE, steps.steps)
        run.stats.record_plain(sum(steps.rows))
        for row, tokens in zip(active, steps.emitted, strict=True):
            row.by_option[AUTOREGRESSIVE] += len(tokens)
        records = [  # a plain step is its forward: 1 new token per row
            StepRecord(AUTOREGRESSIVE, n, s, [0] * n, [0] * n, 1, s)
            for n, s in zip(steps.rows, steps.seconds, strict=True)
        ]
        if billed_to is not None:
            records[0].drafter, records[0].wall_s = billed_to, records[0].wall_s + overhead_s
            records[0].setup_s = setup_s
        self._after_step(run, steps.emitted, steps.still, records, run.batch.states)

    def _after_step(
        self,
        run: _Decoding,
        emitted: list[list[int]],
        still: list[int],
        records: list[StepRecord],
        states: TargetStates | None,
    ) -> None:
        """Tell the proposers what each row emitted (with the step's `states`, to those that read them),
        then the controller what the step(s) cost: telling the proposers is part of it, shared by the
        steps told about; dropping finished rows (`_keep_rows`) is not, every option pays it."""
        told = time.perf_counter()
        for d in run.running():
            reads = d.proposer.wants_hidden_states or d.proposer.wants_verify_logits
            self._call(run, d.name, d.proposer.emitted, emitted, states if reads else None)
        share = (time.perf_counter() - told) / len(records)
        for record in records:
            record.wall_s += share
        if self.controller is not None:
            for record in records:
                self.controller.observe(record)
        self._keep_rows(run, still)

    def _keep_rows(self, run: _Decoding, still: list[int]) -> None:
        """The one row-selection step: only batch rows `still` (in order) go on, in the batch (its cache,
        keys and states), in every started drafter's rows and in the controller's."""
        if len(still) == len(run.batch.active):
            return
        run.batch.keep(still)
        for d in run.running():
            self._call(run, d.name, d.proposer.keep_rows, still)
        if self.controller is not None:
            self.controller.keep_rows(still)

    def _row_strategy(self, counts: Counter[str], fixed: str) -> str:
        """What decoded the row: `fixed` without a controller; under one, whichever option emitted most."""
        if self.controller is None:
            return fixed
        return max(self.options, key=counts.__getitem__)

    def _plan(self, live: dict[str, DraftingMethod], batch_size: int) -> Plan:
        if self.controller is not None:
            return self.controller.plan(batch_size)
        if not live:
            return Plan(AUTOREGRESSIVE, 0, 0, steps=None)
        d = next(iter(live.values()))
        longest = d.start_depth is None or d.proposer.sizes_own_drafts  # one that sizes its own may use all
        depth = d.max_depth if longest else d.start_depth
        return Plan(d.name, depth, d.limits().first_nodes if d.trees else depth)

    def _call(self, run: _Decoding, name: str, fn: Callable[..., object], *args: object) -> bool:
        """Run a proposer callback; on an exception the drafter is off for the batch (a fallback, logged)."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            run.stats.fault(name, f"proposer {name}: {type(exc).__name__}: {exc}")
            run.live.pop(name, None)
            if self.controller is not None:
                self.controller.drafter_failed(name, f"proposer raised {type(exc).__name__}")
            return False

    def _room(self, batch: Batch, row: Row, depth: int) -> int:
        """Draft tokens `row` can still emit, at most `depth`: a step emits them plus one target token."""
        prompt = row.request.prompt
        room = min(batch.params.max_new_tokens, self.runner.max_context - len(prompt)) - len(row.tokens) - 1
        return max(0, min(depth, room))

    def _drafts(self, run: _Decoding, drafter: DraftingMethod, context: ProposalContext) -> list[Draft]:
        """The drafter's drafts, each checked; empty drafts when it failed."""
        empty = [Draft.empty() for _ in context.budgets]
        drafts: list[Draft] = []
        if not self._call(run, drafter.name, lambda: drafts.extend(drafter.proposer.propose(context))):
            return empty
        if len(drafts) != len(context.budgets):
            message = f"proposer {drafter.name}: {len(drafts)} drafts for {len(context.budgets)} rows"
            run.stats.fault(drafter.name, message)
            return empty
        checked = []
        for draft, budget in zip(drafts, context.budgets, strict=True):
            if draft_problem(draft, self.runner.vocab_size, context.max_nodes, budget) is not None:
                run.stats.fallbacks += 1
                draft = Draft.empty()
            checked.append(draft)
        return checked


def _free_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

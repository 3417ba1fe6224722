"""Draft, then verify: the decoding loop shared by every proposer, for chains and trees alike.

Each step: a drafter's proposer drafts below every row's pending token; one target forward verifies
all rows (`[pending, nodes…]` with a tree mask and depth positions); the acceptance rule picks each
row's accepted path and the target token after it; slots off the path are invalidated in the
ragged cache, so rows of one step keep different numbers of tokens. Emitted tokens go through the
same finish checks as autoregressive decoding, one at a time, so EOS, stop strings,
`max_new_tokens` and the context end a row exactly where plain decoding would.

With a controller (`control.Controller`), each step may use any of several drafters or none, and
rows whose drafts keep failing step plainly. Steps without drafts are the autoregressive strategy's
own (`plain.decode_plainly`), run for as many steps as the controller's plan allows. Faults are
fallbacks: a proposer that raises is off for the rest of the batch; a verify forward that raises (a
CUDA out-of-memory error, say) leaves every row's cache as it was, and the step is redone plainly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from strategies.acceptance import Verdict, rejection_chain, relaxed_walk, walk
from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest
from strategies.control import AUTOREGRESSIVE, Controller, Plan, StepRecord
from strategies.drafts import Draft, draft_problem, tree_attention, tree_depths
from strategies.kv_cache import RaggedKV
from strategies.plain import Batch, decode_plainly, start_batch
from strategies.proposer import ProposalContext, Proposer
from strategies.runner import ModelRunner
from strategies.sampling import filtered_probs, keyed_uniform, sample_from

# Streams of keyed uniforms: 0 is the target's own draw (as in autoregressive decoding).
STREAM_ACCEPT, STREAM_RESIDUAL = 1, 2
COMPACT_WASTE = 0.5  # compact the cache when more than this share of its slots is dead


@dataclass(frozen=True)
class RelaxedRule:
    """SpecDec's relaxed verification (greedy only)."""

    top_beta: int
    tolerance: float


@dataclass
class Drafter:
    """A proposer with the limits and acceptance rule of the strategy it serves."""

    name: str
    proposer: Proposer
    max_depth: int  # longest draft path (chain length)
    max_nodes: int  # most nodes per row (trees); chains: max_depth
    relaxed: RelaxedRule | None = None
    learns: bool = False  # it learns from every batch it sees (a Lookahead trie), drafting or not


@dataclass
class SpecStats:
    """Per-batch speculation metrics (DESIGN.md, "Metrics vocabulary")."""

    target_forwards: int = 0
    row_steps: int = 0  # (row, verify forward) pairs
    drafts: int = 0  # row steps with at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    fallbacks: int = 0  # row steps whose draft was refused (invalid or proposer error)
    faults: list[str] = field(default_factory=list)  # drafter and verify faults, with their reason
    proposed_at: list[int] = field(default_factory=list)  # draft tokens at depth d+1
    accepted_at: list[int] = field(default_factory=list)
    steps_by_drafter: dict[str, int] = field(default_factory=dict)

    def record(self, draft: Draft, verdict: Verdict) -> None:
        self.row_steps += 1
        self.drafts += bool(len(draft))
        self.draft_tokens += len(draft)
        self.accepted_tokens += len(verdict.path)
        self.emitted_tokens += len(verdict.tokens)
        for d in tree_depths(draft.parents)[1:]:
            _bump(self.proposed_at, d - 1)
        for d in range(len(verdict.path)):
            _bump(self.accepted_at, d)

    def record_plain(self, row_steps: int) -> None:
        """Steps without drafts: each row emitted one token a step."""
        self.row_steps += row_steps
        self.emitted_tokens += row_steps

    def as_dict(self) -> dict:
        accepted_at = self.accepted_at + [0] * (len(self.proposed_at) - len(self.accepted_at))
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallbacks": self.fallbacks,
            "faults": self.faults,
            "steps_by_drafter": self.steps_by_drafter,
            "acceptance_by_position": [round(a / p, 4) for a, p in zip(accepted_at, self.proposed_at, strict=True)],
            # τ: tokens a row gains per target forward, the bonus/correction token included.
            "mean_accepted_length": round(self.emitted_tokens / self.row_steps, 4) if self.row_steps else None,
        }


def _bump(counts: list[int], index: int) -> None:
    counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1


@dataclass
class _Decoding:
    """One batch in the speculative loop: its rows, its metrics and its drafters' state."""

    batch: Batch
    emitted_by: list[dict[str, int]]  # per request: tokens emitted under each option
    live: dict[str, Drafter]  # drafters not failed in this batch
    started: set[str] = field(default_factory=set)  # drafters started in this batch
    stats: SpecStats = field(default_factory=SpecStats)

    def running(self) -> list[Drafter]:
        """The live drafters that have started, as a list: a failing callback removes its drafter."""
        return [d for name, d in self.live.items() if name in self.started]


class SpeculativeStrategy:
    """Speculative decoding with one drafter (a fixed strategy) or several under a controller (`auto`)."""

    def __init__(self, name: str, runner: ModelRunner, drafters: list[Drafter], controller: Controller | None = None):
        if controller is None and len(drafters) != 1:
            raise ValueError("several drafters need a controller to choose among them")
        self.name = name
        self.runner = runner
        self.drafters = {d.name: d for d in drafters}
        self.controller = controller

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        if any(d.relaxed for d in self.drafters.values()) and not params.sampling.greedy:
            raise ValueError(f"{self.name} relaxes greedy verification: use it with temperature 0")
        run = _Decoding(
            batch=start_batch(self.runner, requests, params),
            emitted_by=[dict.fromkeys(self.drafters, 0) | {AUTOREGRESSIVE: 0} for _ in requests],
            live=dict(self.drafters),
        )
        batch = run.batch
        if batch.active:
            if self.controller is not None:
                limits = {name: (d.max_depth, d.max_nodes) for name, d in run.live.items()}
                self.controller.start_batch(limits, len(batch.active))
            # A drafter starts (prefills, indexes) when first planned, so one the controller keeps off
            # costs nothing; one that learns from every batch starts at once while the controller
            # thinks it may pay, so that it keeps learning while off.
            for name, d in list(run.live.items()):
                if d.learns and (self.controller is None or self.controller.worth_learning(name, len(batch.active))):
                    self._start(run, d)
        while batch.active:
            plan = self._plan(run.live, len(batch.active))
            drafter = run.live.get(plan.drafter)
            if drafter is not None and drafter.name not in run.started and not self._start(run, drafter):
                drafter = None
            if drafter is None:
                self._plain(run, plan.steps)
                continue
            began = time.perf_counter()  # a batch's one start per drafter is not a step's cost
            context = ProposalContext(
                generated=[len(batch.outputs[i]) for i in batch.active],
                budgets=[
                    0 if row in plan.rows_off else self._room(requests[i], batch.outputs[i], params, plan.depth)
                    for row, i in enumerate(batch.active)
                ],
                max_nodes=plan.nodes,
            )
            if not any(context.budgets):  # every row is off or at its end: nothing to ask the drafter
                self._plain(run, 1)
                continue
            drafts = self._drafts(run, drafter, context)
            if not any(len(d) for d in drafts):  # nothing to verify: a plain step, at the drafter's cost
                self._plain(run, 1, billed_to=drafter.name, overhead_s=time.perf_counter() - began)
                continue
            verdicts = self._speculate(run, drafter, drafts, context)
            if verdicts is None:  # the verify forward raised; the cache is as before the step
                self._plain(run, 1)
                continue
            self._drafted(run, drafter.name, drafts, verdicts, began)
        rows = [
            RowOutput(tokens=o, finish_reason=r, strategy=self._row_strategy(counts))
            for o, r, counts in zip(batch.outputs, batch.reasons, run.emitted_by, strict=True)
        ]
        extra: dict = {}
        for d in run.running():
            extra.update(d.proposer.stats())
        stats = {**run.stats.as_dict(), **extra}
        return BatchOutput(rows=rows, strategy=self.name, target_forwards=run.stats.target_forwards, stats=stats)

    def _start(self, run: _Decoding, drafter: Drafter) -> bool:
        """Start `drafter` on the active rows' contexts; one that raises is off for the batch."""
        run.started.add(drafter.name)
        batch = run.batch
        contexts = [batch.requests[i].prompt + batch.outputs[i] for i in batch.active]
        return self._call(run, drafter.name, drafter.proposer.start, contexts, batch.keys, batch.params)

    def _speculate(
        self, run: _Decoding, drafter: Drafter, drafts: list[Draft], context: ProposalContext
    ) -> list[Verdict] | None:
        """Verify the drafts in one target forward and roll the rejected slots back; None when the
        verify forward raised (a CUDA out-of-memory error, say): the drafter is off for the batch."""
        kv = run.batch.kv
        first_slot = kv.num_slots
        pending = [run.batch.outputs[i][-1] for i in run.batch.active]
        try:
            logits = self._verify(kv, pending, drafts)
            verdicts = self._accept(logits, drafts, context, run.batch.keys, run.batch.params, drafter)
        except Exception as exc:  # runner.forward left the cache as it was
            run.stats.faults.append(f"verify with {drafter.name}: {type(exc).__name__}: {exc}")
            if self.controller is not None:
                self.controller.drafter_failed(drafter.name, f"verify forward raised {type(exc).__name__}")
            run.live.pop(drafter.name, None)
            _free_device_memory(self.runner.device)
            return None
        keep = torch.zeros_like(kv.valid)  # slots off each row's accepted path leave the cache
        for row, verdict in enumerate(verdicts):
            keep[row, [first_slot + s for s in (0, *verdict.path)]] = True
        kv.invalidate(~keep & (torch.arange(kv.num_slots, device=keep.device) >= first_slot))
        if kv.waste() > COMPACT_WASTE:
            kv.compact()
        return verdicts

    def _drafted(
        self, run: _Decoding, drafter: str, drafts: list[Draft], verdicts: list[Verdict], began: float
    ) -> None:
        """Emit a drafted step's tokens through the finish checks, one at a time, and report the step."""
        batch, stats = run.batch, run.stats
        stats.target_forwards += 1
        stats.steps_by_drafter[drafter] = stats.steps_by_drafter.get(drafter, 0) + 1
        still = []
        for row, (i, draft, verdict) in enumerate(zip(batch.active, drafts, verdicts, strict=True)):
            stats.record(draft, verdict)
            for token in verdict.tokens:
                run.emitted_by[i][drafter] += 1
                if batch.emit(i, token):
                    break
            if batch.reasons[i] is None:
                still.append(row)
        drafted, accepted = [len(d) for d in drafts], [len(v.path) for v in verdicts]
        record = StepRecord(drafter, len(batch.active), time.perf_counter() - began, drafted, accepted)
        self._after_step(run, [v.tokens for v in verdicts], still, [record])

    def _plain(
        self, run: _Decoding, max_steps: int | None, billed_to: str | None = None, overhead_s: float = 0.0
    ) -> None:
        """Plain steps, the autoregressive strategy's own (`plain.decode_plainly`). The controller sees
        each as a plain step, or, after a drafter that found nothing to draft (`billed_to`), as that
        drafter's step, its drafting time (`overhead_s`) included: steps where it finds nothing are
        part of what the drafter is worth."""
        active = run.batch.active
        steps = decode_plainly(self.runner, run.batch, max_steps)
        run.stats.target_forwards += steps.steps
        run.stats.steps_by_drafter[AUTOREGRESSIVE] = run.stats.steps_by_drafter.get(AUTOREGRESSIVE, 0) + steps.steps
        run.stats.record_plain(sum(steps.rows))
        for i, tokens in zip(active, steps.emitted, strict=True):
            run.emitted_by[i][AUTOREGRESSIVE] += len(tokens)
        records = [
            StepRecord(AUTOREGRESSIVE, n, s, [0] * n, [0] * n) for n, s in zip(steps.rows, steps.seconds, strict=True)
        ]
        if billed_to is not None:
            records[0].drafter, records[0].wall_s = billed_to, records[0].wall_s + overhead_s
        self._after_step(run, steps.emitted, steps.still, records)

    def _after_step(
        self, run: _Decoding, emitted: list[list[int]], still: list[int], records: list[StepRecord]
    ) -> None:
        """Tell the proposers what each row emitted and which rows go on, then the controller what the
        step(s) cost: telling the proposers is part of it, shared by the steps told about; dropping
        finished rows is not, every option pays it."""
        told = time.perf_counter()
        for d in run.running():
            self._call(run, d.name, d.proposer.accepted, emitted)
        share = (time.perf_counter() - told) / len(records)
        for record in records:
            record.wall_s += share
        batch_size = len(run.batch.active)
        if len(still) < batch_size:
            run.batch.keep(still)
            for d in run.running():
                self._call(run, d.name, d.proposer.keep_rows, still)
        if self.controller is not None:
            for record in records:
                self.controller.observe(record)
            if len(still) < batch_size:
                self.controller.keep_rows(still)

    def _row_strategy(self, counts: dict[str, int]) -> str:
        """What decoded the row: the strategy itself when fixed; under a controller, whichever emitted most."""
        if self.controller is None:
            return self.name
        return max(counts, key=lambda name: counts[name])

    def _plan(self, live: dict[str, Drafter], batch_size: int) -> Plan:
        if self.controller is not None:
            return self.controller.plan(batch_size)
        if not live:
            return Plan(AUTOREGRESSIVE, 0, 0, steps=None)
        d = next(iter(live.values()))
        return Plan(d.name, d.max_depth, d.max_nodes)

    def _call(self, run: _Decoding, name: str, fn: Callable[..., object], *args: object) -> bool:
        """Run a proposer callback; on an exception the drafter is off for the batch (a fallback, logged)."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            run.stats.faults.append(f"proposer {name}: {type(exc).__name__}: {exc}")
            run.live.pop(name, None)
            if self.controller is not None:
                self.controller.drafter_failed(name, f"proposer raised {type(exc).__name__}")
            return False

    def _room(self, request: RowRequest, output: list[int], params: GenerationParams, depth: int) -> int:
        """Draft tokens that can still be emitted: a step emits them plus one target token."""
        room = min(params.max_new_tokens, self.runner.max_context - len(request.prompt)) - len(output) - 1
        return max(0, min(depth, room))

    def _drafts(self, run: _Decoding, drafter: Drafter, context: ProposalContext) -> list[Draft]:
        """The drafter's drafts, each checked; empty drafts when it failed."""
        empty = [Draft.empty() for _ in context.budgets]
        drafts: list[Draft] = []
        if not self._call(run, drafter.name, lambda: drafts.extend(drafter.proposer.propose(context))):
            return empty
        if len(drafts) != len(context.budgets):
            run.stats.faults.append(f"proposer {drafter.name}: {len(drafts)} drafts for {len(context.budgets)} rows")
            return empty
        checked = []
        for draft, budget in zip(drafts, context.budgets, strict=True):
            if draft_problem(draft, self.runner.vocab_size, context.max_nodes, budget) is not None:
                run.stats.fallbacks += 1
                draft = Draft.empty()
            checked.append(draft)
        return checked

    def _verify(self, kv: RaggedKV, pending: list[int], drafts: list[Draft]) -> torch.Tensor:
        """One target forward over `[pending, nodes…]` of every row; logits [B, 1+N, V]."""
        # Built as Python lists and turned into tensors once: per-row tensor writes cost more than the
        # verify forward's own launches on a GPU at small batch.
        device = self.runner.device
        width = 1 + max(len(d) for d in drafts)
        ids, depth, valid = [], [], []
        for token, draft in zip(pending, drafts, strict=True):
            pad = [0] * (width - 1 - len(draft))
            ids.append([token, *draft.tokens, *pad])
            depth.append([*tree_depths(draft.parents), *pad])
            valid.append([True] * (1 + len(draft)) + [False] * len(pad))
        chains = all(p == i - 1 for d in drafts for i, p in enumerate(d.parents))
        attend = None if chains else torch.stack([tree_attention(d.parents, width) for d in drafts]).to(device)
        positions = kv.next_pos[:, None] + torch.tensor(depth, device=device)
        ids_t = torch.tensor(ids, dtype=torch.long, device=device)
        out = self.runner.forward(kv, ids_t, positions, torch.tensor(valid, device=device), attend)
        return out.logits

    def _accept(
        self,
        logits: torch.Tensor,  # [B, 1+N, V]
        drafts: list[Draft],
        context: ProposalContext,
        keys: torch.Tensor,
        params: GenerationParams,
        drafter: Drafter | None,
    ) -> list[Verdict]:
        sampling = params.sampling
        if drafter is not None and drafter.relaxed is not None:
            rule = drafter.relaxed
            return [
                relaxed_walk(d, logits[row, : len(d) + 1], rule.top_beta, rule.tolerance)
                for row, d in enumerate(drafts)
            ]
        b, width, _ = logits.shape
        if sampling.greedy:
            chosen = logits.argmax(dim=-1).tolist()  # [B, 1+N]
            return [walk(d, chosen[row]) for row, d in enumerate(drafts)]
        generated = torch.tensor(context.generated, dtype=torch.long)
        depths = torch.zeros(b, width, dtype=torch.long)
        for row, d in enumerate(drafts):
            depths[row, : len(d) + 1] = torch.tensor(tree_depths(d.parents))
        # The token drawn at a slot is generation index `generated + depth` of its row.
        positions = generated[:, None] + depths  # [B, 1+N]
        flat_keys = keys[:, None].expand(b, width).reshape(-1)

        def uniforms(stream: int) -> torch.Tensor:
            return keyed_uniform(sampling.seed, flat_keys, positions.reshape(-1), stream).view(b, width)

        probs = filtered_probs(logits, sampling).cpu()  # [B, 1+N, V]
        draws = uniforms(0)
        if all(d.probs is None for d in drafts):
            chosen = sample_from(probs.reshape(b * width, -1), draws.reshape(-1)).view(b, width).tolist()
            return [walk(d, chosen[row]) for row, d in enumerate(drafts)]
        accept_u, residual_u = uniforms(STREAM_ACCEPT), uniforms(STREAM_RESIDUAL)
        verdicts = []
        for row, d in enumerate(drafts):
            n = len(d)
            if d.probs is None:  # a deterministic draft among probabilistic ones: q is one-hot
                one_hot = torch.nn.functional.one_hot(torch.tensor(d.tokens, dtype=torch.long), probs.shape[-1])
                d = Draft(d.tokens, d.parents, one_hot.to(probs.dtype))
            # Draft token i is a candidate for the token drawn at slot i (generation index generated + i).
            verdicts.append(
                rejection_chain(d, probs[row, : n + 1], accept_u[row, :n], residual_u[row, :n], float(draws[row, n]))
            )
        return verdicts


def _free_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()

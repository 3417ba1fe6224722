"""Draft, then verify: the decoding loop shared by every proposer, for chains and trees alike.

Each step: a drafter's proposer drafts below every row's pending token; one target forward verifies
all rows (`[pending, nodes…]` with a tree mask and depth positions); the acceptance rule picks each
row's accepted path and the target token after it; slots off the path are invalidated in the
ragged cache, so rows of one step keep different numbers of tokens. Emitted tokens go through the
same finish checks as autoregressive decoding, one at a time, so EOS, stop strings,
`max_new_tokens` and the context end a row exactly where plain decoding would.

With a controller (`control.Controller`), each step may use any of several drafters or none (a
plain autoregressive step), and rows whose drafts keep failing step plainly. Faults are fallbacks:
a proposer that raises is off for the rest of the batch; a verify forward that raises (a CUDA
out-of-memory error, say) leaves every row's cache as it was, and the step is redone plainly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from strategies.acceptance import Verdict, rejection_chain, relaxed_walk, walk
from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, finish_reason
from strategies.control import AUTOREGRESSIVE, Controller, Plan, StepRecord
from strategies.drafts import Draft, draft_problem, tree_attention, tree_depths
from strategies.kv_cache import RaggedKV
from strategies.proposer import ProposalContext, Proposer
from strategies.runner import ModelRunner
from strategies.sampling import choose_tokens, filtered_probs, keyed_uniform, sample_from

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

    def record_plain(self, rows: int) -> None:
        """A step without drafts: each row emitted one token."""
        self.row_steps += rows
        self.emitted_tokens += rows

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
        runner, sampling = self.runner, params.sampling
        if any(d.relaxed for d in self.drafters.values()) and not sampling.greedy:
            raise ValueError(f"{self.name} relaxes greedy verification: use it with temperature 0")
        kv = runner.new_kv(len(requests))
        logits = runner.prefill(kv, [r.prompt for r in requests])
        keys = torch.tensor([r.key for r in requests], dtype=torch.long)
        first = choose_tokens(logits, sampling, keys, torch.zeros(len(requests), dtype=torch.long)).tolist()
        outputs = [[t] for t in first]
        reasons = [finish_reason(r, o, params, runner.max_context) for r, o in zip(requests, outputs, strict=True)]
        emitted_by = [dict.fromkeys(self.drafters, 0) | {AUTOREGRESSIVE: 0} for _ in requests]
        active = [i for i, reason in enumerate(reasons) if reason is None]
        stats = SpecStats()
        # Drafters not failed in this batch. A drafter starts (prefills, indexes) when first planned,
        # so one the controller keeps off costs nothing; one that learns from every batch starts at
        # once while the controller thinks it may pay, so that it keeps learning while off.
        live: dict[str, Drafter] = dict(self.drafters)
        started: set[str] = set()

        def start(drafter: Drafter) -> bool:
            """Start `drafter` on the active rows' contexts; one that raises is off for the batch."""
            started.add(drafter.name)
            contexts = [requests[i].prompt + outputs[i] for i in active]
            if self._call(stats, drafter.name, drafter.proposer.start, contexts, keys, params):
                return True
            live.pop(drafter.name)
            return False

        if active:
            if len(active) < len(requests):
                kv.select_rows(torch.tensor(active, device=runner.device))
            keys = keys[active]
            if self.controller is not None:
                limits = {name: (d.max_depth, d.max_nodes) for name, d in live.items()}
                self.controller.start_batch(limits, len(active))
            for name, d in list(live.items()):
                if d.learns and (self.controller is None or self.controller.worth_learning(name, len(active))):
                    start(d)
        while active:
            plan = self._plan(live, len(active))
            drafter = live.get(plan.drafter)
            if drafter is not None and drafter.name not in started and not start(drafter):
                drafter = None
            began = time.perf_counter()  # a batch's one start per drafter is not a step's cost
            context = ProposalContext(
                generated=[len(outputs[i]) for i in active],
                budgets=[
                    0
                    if drafter is None or row in plan.rows_off
                    else self._room(requests[i], outputs[i], params, plan.depth)
                    for row, i in enumerate(active)
                ],
                max_nodes=plan.nodes,
            )
            drafts = self._drafts(drafter, context, stats, live)
            if not any(len(d) for d in drafts):
                drafter = None  # nothing to verify: a plain step
            pending = [outputs[i][-1] for i in active]
            first_slot = kv.num_slots
            verdicts = None
            if drafter is not None:
                try:
                    logits = self._verify(kv, pending, drafts)
                    verdicts = self._accept(logits, drafts, context, keys, params, drafter)
                except Exception as exc:  # the cache is as before the step (runner.forward); redo it plainly
                    stats.faults.append(f"verify with {drafter.name}: {type(exc).__name__}: {exc}")
                    if self.controller is not None:
                        self.controller.drafter_failed(drafter.name, f"verify forward raised {type(exc).__name__}")
                    live.pop(drafter.name, None)
                    _free_device_memory(runner.device)
                    drafter, drafts = None, [Draft.empty() for _ in active]
            if verdicts is None:
                verdicts = self._plain_step(kv, pending, context, keys, params)
            used = drafter.name if drafter is not None else AUTOREGRESSIVE
            stats.target_forwards += 1
            stats.steps_by_drafter[used] = stats.steps_by_drafter.get(used, 0) + 1
            if drafter is None:
                stats.record_plain(len(verdicts))
            else:
                for draft, verdict in zip(drafts, verdicts, strict=True):
                    stats.record(draft, verdict)
            if drafter is not None:  # slots off each row's accepted path leave the cache
                keep = torch.zeros_like(kv.valid)
                for row, verdict in enumerate(verdicts):
                    keep[row, [first_slot + s for s in (0, *verdict.path)]] = True
                kv.invalidate(~keep & (torch.arange(kv.num_slots, device=keep.device) >= first_slot))
                if kv.waste() > COMPACT_WASTE:
                    kv.compact()
            emitted = [v.tokens for v in verdicts]
            for name, d in self._started(live, started):
                if not self._call(stats, name, d.proposer.accepted, emitted):
                    live.pop(name)
            still = []
            for row, (i, verdict) in enumerate(zip(active, verdicts, strict=True)):
                for token in verdict.tokens:
                    outputs[i].append(token)
                    emitted_by[i][used] += 1
                    reasons[i] = finish_reason(requests[i], outputs[i], params, runner.max_context)
                    if reasons[i] is not None:
                        break
                if reasons[i] is None:
                    still.append(row)
            batch_size, wall_s = len(active), time.perf_counter() - began
            if len(still) < len(active):
                kv.select_rows(torch.tensor(still, dtype=torch.long, device=runner.device))
                keys = keys[still]
                active = [active[row] for row in still]
                for name, d in self._started(live, started):
                    if not self._call(stats, name, d.proposer.keep_rows, still):
                        live.pop(name)
            if self.controller is not None:
                # The step's cost as the controller must weigh it: drafting, verifying, rolling back and
                # telling the proposers. Dropping finished rows is not counted: every option pays it.
                drafted, accepted = [len(d) for d in drafts], [len(v.path) for v in verdicts]
                self.controller.observe(StepRecord(used, batch_size, wall_s, drafted, accepted))
                if len(still) < batch_size:
                    self.controller.keep_rows(still)
        rows = [
            RowOutput(tokens=o, finish_reason=r, strategy=self._row_strategy(counts))
            for o, r, counts in zip(outputs, reasons, emitted_by, strict=True)
        ]
        extra: dict = {}
        for _, d in self._started(live, started):
            extra.update(d.proposer.stats())
        return BatchOutput(
            rows=rows, strategy=self.name, target_forwards=stats.target_forwards, stats={**stats.as_dict(), **extra}
        )

    @staticmethod
    def _started(live: dict[str, Drafter], started: set[str]) -> list[tuple[str, Drafter]]:
        """The live drafters that have started, as a list: a failing callback removes its drafter."""
        return [(name, d) for name, d in live.items() if name in started]

    def _row_strategy(self, counts: dict[str, int]) -> str:
        """What decoded the row: the strategy itself when fixed; under a controller, whichever emitted most."""
        if self.controller is None:
            return self.name
        return max(counts, key=lambda name: counts[name])

    def _plan(self, live: dict[str, Drafter], batch_size: int) -> Plan:
        if self.controller is not None:
            return self.controller.plan(batch_size)
        if not live:
            return Plan(AUTOREGRESSIVE, 0, 0)
        d = next(iter(live.values()))
        return Plan(d.name, d.max_depth, d.max_nodes)

    def _call(self, stats: SpecStats, name: str, fn: Callable[..., object], *args: object) -> bool:
        """Run a proposer callback; on an exception the drafter is off for the batch (a fallback, logged)."""
        try:
            fn(*args)
            return True
        except Exception as exc:
            stats.faults.append(f"proposer {name}: {type(exc).__name__}: {exc}")
            if self.controller is not None:
                self.controller.drafter_failed(name, f"proposer raised {type(exc).__name__}")
            return False

    def _room(self, request: RowRequest, output: list[int], params: GenerationParams, depth: int) -> int:
        """Draft tokens that can still be emitted: a step emits them plus one target token."""
        room = min(params.max_new_tokens, self.runner.max_context - len(request.prompt)) - len(output) - 1
        return max(0, min(depth, room))

    def _drafts(
        self, drafter: Drafter | None, context: ProposalContext, stats: SpecStats, live: dict[str, Drafter]
    ) -> list[Draft]:
        """The drafter's drafts, each checked; empty drafts when there is none or it failed."""
        empty = [Draft.empty() for _ in context.budgets]
        if drafter is None or not any(context.budgets):
            return empty
        drafts: list[Draft] = []
        if not self._call(stats, drafter.name, lambda: drafts.extend(drafter.proposer.propose(context))):
            live.pop(drafter.name, None)
            return empty
        if len(drafts) != len(context.budgets):
            stats.faults.append(f"proposer {drafter.name}: {len(drafts)} drafts for {len(context.budgets)} rows")
            return empty
        checked = []
        for draft, budget in zip(drafts, context.budgets, strict=True):
            if draft_problem(draft, self.runner.vocab_size, context.max_nodes, budget) is not None:
                stats.fallbacks += 1
                draft = Draft.empty()
            checked.append(draft)
        return checked

    def _plain_step(
        self, kv: RaggedKV, pending: list[int], context: ProposalContext, keys: torch.Tensor, params: GenerationParams
    ) -> list[Verdict]:
        """One autoregressive step for every row, as lean as the autoregressive strategy's."""
        device = self.runner.device
        ids = torch.tensor(pending, dtype=torch.long, device=device)[:, None]  # [B, 1]
        out = self.runner.forward(kv, ids, kv.next_pos[:, None], torch.ones_like(ids, dtype=torch.bool))
        positions = None if params.sampling.greedy else torch.tensor(context.generated, dtype=torch.long)
        tokens = choose_tokens(out.logits[:, -1], params.sampling, keys, positions).tolist()
        return [Verdict(path=[], tokens=[t]) for t in tokens]

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

"""Draft, then verify: the decoding loop shared by every proposer, for chains and trees alike.

Each step: the proposer drafts below every row's pending token; one target forward verifies all
rows (`[pending, nodes…]` with a tree mask and depth positions); the acceptance rule picks each
row's accepted path and the target token after it; slots off the path are invalidated in the
ragged cache, so rows of one step keep different numbers of tokens. Emitted tokens go through the
same finish checks as autoregressive decoding, one at a time, so EOS, stop strings,
`max_new_tokens` and the context end a row exactly where plain decoding would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from strategies.acceptance import Verdict, rejection_chain, relaxed_walk, walk
from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, finish_reason
from strategies.drafts import Draft, draft_problem, tree_attention, tree_depths
from strategies.kv_cache import RaggedKV
from strategies.proposer import ProposalContext, Proposer
from strategies.runner import ModelRunner
from strategies.sampling import choose_tokens, filtered_probs, keyed_uniform, sample_from

# Streams of keyed uniforms: 0 is the target's own draw (as in autoregressive decoding).
STREAM_ACCEPT, STREAM_RESIDUAL = 1, 2
COMPACT_WASTE = 0.5  # compact the cache when more than this share of its slots is dead


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
    proposed_at: list[int] = field(default_factory=list)  # draft tokens at depth d+1
    accepted_at: list[int] = field(default_factory=list)

    def record(self, draft: Draft, verdict: Verdict) -> None:
        self.row_steps += 1
        self.drafts += bool(len(draft))
        self.draft_tokens += len(draft)
        self.accepted_tokens += len(verdict.path)
        depths = tree_depths(draft.parents)[1:]
        for d in depths:
            _bump(self.proposed_at, d - 1)
        for d in range(len(verdict.path)):
            _bump(self.accepted_at, d)

    def as_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallbacks": self.fallbacks,
            "acceptance_by_position": [
                round(a / p, 4) if p else None
                for a, p in zip(self.accepted_at + [0] * 99, self.proposed_at, strict=False)
            ],
            # τ: tokens a row gains per target forward, the bonus/correction token included.
            "mean_accepted_length": round(self.emitted_tokens / self.row_steps, 4) if self.row_steps else None,
        }


def _bump(counts: list[int], index: int) -> None:
    counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1


@dataclass(frozen=True)
class RelaxedRule:
    """SpecDec's relaxed verification (greedy only)."""

    top_beta: int
    tolerance: float


class SpeculativeStrategy:
    """Speculative decoding with any proposer; `relaxed` turns exact greedy verification into SpecDec's."""

    def __init__(
        self,
        name: str,
        runner: ModelRunner,
        proposer: Proposer,
        max_depth: int,
        relaxed: RelaxedRule | None = None,
        max_nodes: int | None = None,
    ):
        """`max_depth`: longest draft path (chain length); `max_nodes`: most nodes of a tree (default: chains)."""
        self.name = name
        self.runner = runner
        self.proposer = proposer
        self.max_depth = max_depth
        self.max_nodes = max_depth if max_nodes is None else max_nodes
        self.relaxed = relaxed

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        runner, sampling = self.runner, params.sampling
        if self.relaxed is not None and not sampling.greedy:
            raise ValueError(f"{self.name} relaxes greedy verification: use it with temperature 0")
        kv = runner.new_kv(len(requests))
        logits = runner.prefill(kv, [r.prompt for r in requests])
        keys = torch.tensor([r.key for r in requests], dtype=torch.long)
        first = choose_tokens(logits, sampling, keys, torch.zeros(len(requests), dtype=torch.long)).tolist()
        outputs = [[t] for t in first]
        reasons = [finish_reason(r, o, params, runner.max_context) for r, o in zip(requests, outputs, strict=True)]
        active = [i for i, reason in enumerate(reasons) if reason is None]
        stats = SpecStats()
        proposer_ok = True
        if active:
            if len(active) < len(requests):
                kv.select_rows(torch.tensor(active, device=runner.device))
            keys = keys[active]
            try:
                self.proposer.start([requests[i].prompt for i in active], keys, params)
            except Exception:
                proposer_ok = False
        while active:
            context = ProposalContext(
                pending=[outputs[i][-1] for i in active],
                generated=[len(outputs[i]) for i in active],
                budgets=[self._budget(requests[i], outputs[i], params) for i in active],
            )
            drafts = self._drafts(context, proposer_ok, stats)
            if drafts is None:
                proposer_ok = False
                drafts = [Draft.empty() for _ in active]
            first_slot = kv.num_slots
            logits = self._verify(kv, context, drafts)
            verdicts = self._accept(logits, drafts, context, keys, params)
            stats.target_forwards += 1
            keep = torch.zeros_like(kv.valid)
            for row, (verdict, draft) in enumerate(zip(verdicts, drafts, strict=True)):
                keep[row, [first_slot + s for s in (0, *verdict.path)]] = True
                stats.record(draft, verdict)
            kv.invalidate(~keep & (torch.arange(kv.num_slots, device=keep.device) >= first_slot))
            if proposer_ok:
                try:
                    self.proposer.accepted([v.tokens for v in verdicts])
                except Exception:
                    proposer_ok = False
            still = []
            for row, (i, verdict) in enumerate(zip(active, verdicts, strict=True)):
                for token in verdict.tokens:
                    outputs[i].append(token)
                    stats.emitted_tokens += 1
                    reasons[i] = finish_reason(requests[i], outputs[i], params, runner.max_context)
                    if reasons[i] is not None:
                        break
                if reasons[i] is None:
                    still.append(row)
            if len(still) < len(active):
                kv.select_rows(torch.tensor(still, dtype=torch.long, device=runner.device))
                keys = keys[still]
                active = [active[row] for row in still]
                if proposer_ok:
                    try:
                        self.proposer.keep_rows(still)
                    except Exception:
                        proposer_ok = False
            if active and kv.waste() > COMPACT_WASTE:
                kv.compact()
        rows = [RowOutput(tokens=o, finish_reason=r) for o, r in zip(outputs, reasons, strict=True)]
        extra = self.proposer.stats() if proposer_ok else {}
        return BatchOutput(
            rows=rows, strategy=self.name, target_forwards=stats.target_forwards, stats={**stats.as_dict(), **extra}
        )

    def _budget(self, request: RowRequest, output: list[int], params: GenerationParams) -> int:
        """Draft tokens that can still be emitted: a step emits them plus one target token."""
        room = min(params.max_new_tokens, self.runner.max_context - len(request.prompt)) - len(output) - 1
        return max(0, min(self.max_depth, room))

    def _drafts(self, context: ProposalContext, proposer_ok: bool, stats: SpecStats) -> list[Draft] | None:
        """The proposer's drafts, each checked; None when the proposer failed (it is off for the batch)."""
        if not proposer_ok:
            return None
        try:
            drafts = self.proposer.propose(context)
        except Exception:
            return None
        if len(drafts) != len(context.pending):
            return None
        checked = []
        for draft, budget in zip(drafts, context.budgets, strict=True):
            if draft_problem(draft, self.runner.vocab_size, self.max_nodes, budget) is not None:
                stats.fallbacks += 1
                draft = Draft.empty()
            checked.append(draft)
        return checked

    def _verify(self, kv: RaggedKV, context: ProposalContext, drafts: list[Draft]) -> torch.Tensor:
        """One target forward over `[pending, nodes…]` of every row; logits [B, 1+N, V]."""
        device = self.runner.device
        width = 1 + max(len(d) for d in drafts)
        b = len(drafts)
        ids = torch.zeros(b, width, dtype=torch.long)
        depth = torch.zeros(b, width, dtype=torch.long)
        valid = torch.zeros(b, width, dtype=torch.bool)
        attend = torch.zeros(b, width, width, dtype=torch.bool)
        for row, draft in enumerate(drafts):
            n = len(draft)
            ids[row, 0] = context.pending[row]
            ids[row, 1 : n + 1] = torch.tensor(draft.tokens, dtype=torch.long)
            depth[row, : n + 1] = torch.tensor(tree_depths(draft.parents))
            valid[row, : n + 1] = True
            attend[row] = tree_attention(draft.parents, width)
        positions = kv.next_pos.cpu()[:, None] + depth
        out = self.runner.forward(kv, ids.to(device), positions.to(device), valid.to(device), attend.to(device))
        return out.logits

    def _accept(
        self,
        logits: torch.Tensor,  # [B, 1+N, V]
        drafts: list[Draft],
        context: ProposalContext,
        keys: torch.Tensor,
        params: GenerationParams,
    ) -> list[Verdict]:
        sampling = params.sampling
        if self.relaxed is not None:
            return [
                relaxed_walk(d, logits[row, : len(d) + 1], self.relaxed.top_beta, self.relaxed.tolerance)
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

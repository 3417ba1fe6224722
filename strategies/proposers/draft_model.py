"""The draft-model proposer: a small LM with the target's tokenizer drafts a chain autoregressively.

Its own ragged cache follows the row's context: tokens the draft has not seen yet (the pending
token, tokens emitted on steps that did not speculate, the last token of a fully accepted chain,
which is never fed since nothing would use its logits) are fed at the start of the next proposal;
drafted tokens that the target rejected are invalidated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from strategies.base import GenerationParams
from strategies.runtime.cached_prefill import prefill
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import STREAM_DRAFT, filtered_probs, greedy_tokens, keyed_uniform, sample_from
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


@dataclass
class _DraftRow:
    context: list[int]  # prompt and generated tokens, the pending one last
    fed: int  # context tokens in the draft's cache
    fed_slots: list[int] = field(default_factory=list)  # cache slots of this step's fed drafts


class DraftModelProposer(Proposer[_DraftRow]):
    """One record per row, and the draft's cache of every row (`kv`, rows in the records' order)."""

    name = "draft_model"  # the `strategy.<name>.drafter` value (`strategies.methods.chain`)
    drafts_per_depth = True

    def __init__(self, draft: ModelRunner, vocab_size: int) -> None:
        self.draft = draft
        self.vocab_size = vocab_size  # the target's: draft logits are cut or padded to it

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        super().start(contexts, params, states)
        self.kv = self._prefilled(contexts)

    def add_rows(self, contexts: list[list[int]], states: TargetStates | None) -> None:
        super().add_rows(contexts, states)
        self.kv.extend(self._prefilled(contexts))

    def new_row_state(self, context: list[int]) -> _DraftRow:
        return _DraftRow(list(context), fed=len(context) - 1)

    def keep_rows(self, rows: list[int]) -> None:
        super().keep_rows(rows)
        if rows:
            self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.draft.device))

    def _prefilled(self, contexts: list[list[int]]) -> RaggedKV:
        """A draft cache of the contexts but their last token (the pending one, fed when drafting): the
        draft's runner keeps a prefix cache of its own where the actor gave it one."""
        kv = self.draft.new_kv(len(contexts))
        prefill(self.draft, kv, [c[:-1] for c in contexts])  # through the draft's own prefix cache, if any
        return kv

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary: [B, V_draft] -> [B, V]."""
        v = logits.shape[-1]
        if v >= self.vocab_size:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, self.vocab_size - v), value=torch.finfo(logits.dtype).min)

    def propose(self, context: ProposalContext) -> list[Draft]:
        draft, kv, sampling = self.draft, self.kv, self.params.sampling
        b = len(self.rows)
        feeds = [row.context[row.fed :] for row in self.rows]  # each ends with the pending token
        width = max(len(f) for f in feeds)
        ids = torch.zeros(b, width, dtype=torch.long)
        valid = torch.zeros(b, width, dtype=torch.bool)
        for row, feed in enumerate(feeds):
            ids[row, : len(feed)] = torch.tensor(feed)
            valid[row, : len(feed)] = True
        positions = kv.next_pos.cpu()[:, None] + (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        last = torch.tensor([len(f) - 1 for f in feeds])
        out = draft.forward(kv, ids.to(draft.device), positions.to(draft.device), valid.to(draft.device))
        logits = self._logits(out.logits[torch.arange(b), last.to(out.logits.device)])  # [B, V]
        for row in self.rows:
            row.fed, row.fed_slots = len(row.context), []

        steps = max(context.budgets)
        tokens: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        drafting = [budget > 0 for budget in context.budgets]
        generated = torch.tensor(context.num_generated, dtype=torch.long)
        eos = self.params.eos_token_ids if not self.params.ignore_eos else frozenset()
        for i in range(steps):
            if sampling.greedy:
                chosen = greedy_tokens(logits)
            else:
                q = filtered_probs(logits, sampling)  # [B, V]
                u = keyed_uniform(sampling.seed, context.keys, generated + i, STREAM_DRAFT)
                chosen = sample_from(q, u.to(q.device))
            chosen_list = chosen.tolist()
            for row in range(b):
                if drafting[row]:
                    tokens[row].append(chosen_list[row])
                    if not sampling.greedy:
                        probs[row].append(q[row])
                    if len(tokens[row]) >= context.budgets[row] or chosen_list[row] in eos:
                        drafting[row] = False
            if i == steps - 1 or not any(drafting):
                break
            feed_valid = torch.tensor(drafting, dtype=torch.bool)[:, None]  # [B, 1]
            slot = kv.num_slots
            for row in range(b):
                if drafting[row]:
                    self.rows[row].fed_slots.append(slot)
            out = draft.forward(kv, chosen[:, None], kv.next_pos[:, None], feed_valid.to(draft.device))
            logits = self._logits(out.logits[:, -1])
        return [Draft.chain(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs, strict=True)]

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        if not any(row.fed_slots for row in self.rows):  # a step that did not draft: only the contexts grow
            for row, tokens in zip(self.rows, emitted, strict=True):
                row.context.extend(tokens)
            return
        drop = torch.zeros_like(self.kv.valid)
        for b, (row, tokens) in enumerate(zip(self.rows, emitted, strict=True)):
            accepted = len(tokens) - 1  # the last token is the target's, the next pending one
            kept = min(accepted, len(row.fed_slots))  # fed drafts that were accepted stay in the cache
            drop[b, row.fed_slots[kept:]] = True
            row.fed += kept
            row.fed_slots = []
            row.context.extend(tokens)
        self.kv.invalidate(drop)
        self.kv.compact_if_wasteful()

"""The draft-model proposer: a small LM with the target's tokenizer drafts a chain autoregressively.

Its own ragged cache follows the row's context: tokens the draft has not seen yet (the pending
token, tokens emitted on steps that did not speculate, the last token of a fully accepted chain,
which is never fed since nothing would use its logits) are fed at the start of the next proposal;
drafted tokens that the target rejected are invalidated.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from strategies.base import GenerationParams
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import STREAM_DRAFT, filtered_probs, keyed_uniform, sample_from
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, TargetStates


class DraftModelProposer:
    name = "draft_model"
    wants_states = False
    model: ClassVar[str] = "draft"  # the `model.<kind>` it drafts with
    draft_probabilities: ClassVar[bool] = True  # drafts carry q, as speculative sampling needs

    def __init__(self, draft: ModelRunner, vocab_size: int) -> None:
        self.draft = draft
        self.vocab_size = vocab_size  # the target's: draft logits are cut or padded to it

    def start(
        self, contexts: list[list[int]], keys: torch.Tensor, params: GenerationParams, states: TargetStates | None
    ) -> None:
        self.params = params
        self.keys = keys
        self.contexts = [list(c) for c in contexts]
        self.kv = self._prefilled(contexts)
        self.fed = [len(c) - 1 for c in contexts]  # context tokens in the draft's cache
        self.fed_slots: list[list[int]] = [[] for _ in contexts]  # cache slots of this step's fed drafts

    def add_rows(self, contexts: list[list[int]], keys: torch.Tensor, states: TargetStates | None) -> None:
        self.kv.extend(self._prefilled(contexts))
        self.keys = torch.cat([self.keys, keys])
        self.contexts += [list(c) for c in contexts]
        self.fed += [len(c) - 1 for c in contexts]
        self.fed_slots += [[] for _ in contexts]

    def _prefilled(self, contexts: list[list[int]]) -> RaggedKV:
        """A draft cache of the contexts but their last token (the pending one, fed when drafting)."""
        kv = self.draft.new_kv(len(contexts))
        self.draft.prefill(kv, [c[:-1] for c in contexts])
        return kv

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary: [B, V_draft] -> [B, V]."""
        v = logits.shape[-1]
        if v >= self.vocab_size:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, self.vocab_size - v), value=torch.finfo(logits.dtype).min)

    def propose(self, context: ProposalContext) -> list[Draft]:
        draft, kv, sampling = self.draft, self.kv, self.params.sampling
        b = len(self.contexts)
        feeds = [ctx[fed:] for ctx, fed in zip(self.contexts, self.fed, strict=True)]  # ends with the pending token
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
        self.fed = [len(ctx) for ctx in self.contexts]

        steps = max(context.budgets)
        tokens: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        drafting = [budget > 0 for budget in context.budgets]
        self.fed_slots = [[] for _ in range(b)]
        generated = torch.tensor(context.num_generated, dtype=torch.long)
        eos = self.params.eos_token_ids if not self.params.ignore_eos else frozenset()
        for i in range(steps):
            if sampling.greedy:
                chosen = logits.argmax(dim=-1)
            else:
                q = filtered_probs(logits, sampling)  # [B, V]
                u = keyed_uniform(sampling.seed, self.keys, generated + i, STREAM_DRAFT)
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
                    self.fed_slots[row].append(slot)
            out = draft.forward(kv, chosen[:, None], kv.next_pos[:, None], feed_valid.to(draft.device))
            logits = self._logits(out.logits[:, -1])
        return [Draft.chain(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs, strict=True)]

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        if not any(self.fed_slots):  # a step that did not draft: only the contexts grow
            for ctx, tokens in zip(self.contexts, emitted, strict=True):
                ctx.extend(tokens)
            return
        drop = torch.zeros_like(self.kv.valid)
        for row, tokens in enumerate(emitted):
            accepted = len(tokens) - 1  # the last token is the target's, the next pending one
            slots = self.fed_slots[row]
            kept = min(accepted, len(slots))  # fed drafts that were accepted stay in the cache
            drop[row, slots[kept:]] = True
            self.fed[row] += kept
            self.contexts[row].extend(tokens)
        self.fed_slots = [[] for _ in emitted]
        self.kv.invalidate(drop)
        self.kv.compact_if_wasteful()

    def keep_rows(self, rows: list[int]) -> None:
        if not rows:
            return
        self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.draft.device))
        self.keys = self.keys[rows]
        self.contexts = [self.contexts[r] for r in rows]
        self.fed = [self.fed[r] for r in rows]
        self.fed_slots = [self.fed_slots[r] for r in rows]

    def stats(self) -> dict[str, float]:
        return {}

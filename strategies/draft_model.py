"""The draft-model proposer: a small LM with the target's tokenizer drafts a chain autoregressively.

Its own ragged cache stays in step with the target's: tokens emitted by the target that the draft
has not seen yet (`unfed`) are fed at the start of the next proposal together with the pending
token; drafted tokens that the target rejected are invalidated. The last drafted token of a chain
is never fed (nothing would use its logits), so after a fully accepted chain it is fed next time.
"""

from __future__ import annotations

import torch

from strategies.base import GenerationParams
from strategies.drafts import Draft
from strategies.proposer import ProposalContext
from strategies.runner import ModelRunner
from strategies.sampling import filtered_probs, keyed_uniform, sample_from

STREAM_DRAFT = 3  # keyed uniforms of the draft's own sampling
COMPACT_WASTE = 0.5


class DraftModelProposer:
    name = "draft_model"

    def __init__(self, draft: ModelRunner, vocab_size: int) -> None:
        self.draft = draft
        self.vocab_size = vocab_size  # the target's: draft logits are cut or padded to it

    def start(self, prompts: list[list[int]], keys: torch.Tensor, params: GenerationParams) -> None:
        self.params = params
        self.keys = keys
        self.kv = self.draft.new_kv(len(prompts))
        self.draft.prefill(self.kv, prompts)
        self.unfed: list[list[int]] = [[] for _ in prompts]
        self.fed_slots: list[list[int]] = [[] for _ in prompts]  # cache slots of this step's fed drafts

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary: [B, V_draft] -> [B, V]."""
        v = logits.shape[-1]
        if v >= self.vocab_size:
            return logits[:, : self.vocab_size]
        return torch.nn.functional.pad(logits, (0, self.vocab_size - v), value=torch.finfo(logits.dtype).min)

    def propose(self, context: ProposalContext) -> list[Draft]:
        draft, kv, sampling = self.draft, self.kv, self.params.sampling
        b = len(context.pending)
        feeds = [[*u, p] for u, p in zip(self.unfed, context.pending, strict=True)]
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
        self.unfed = [[] for _ in range(b)]

        steps = max(context.budgets)
        tokens: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        drafting = [budget > 0 for budget in context.budgets]
        self.fed_slots = [[] for _ in range(b)]
        generated = torch.tensor(context.generated, dtype=torch.long)
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

    def accepted(self, emitted: list[list[int]]) -> None:
        drop = torch.zeros_like(self.kv.valid)
        for row, tokens in enumerate(emitted):
            accepted = len(tokens) - 1  # the last token is the target's, the next pending one
            fed = self.fed_slots[row]
            kept = min(accepted, len(fed))
            drop[row, fed[kept:]] = True
            self.unfed[row] = tokens[kept:accepted]
        self.kv.invalidate(drop)
        if self.kv.waste() > COMPACT_WASTE:
            self.kv.compact()

    def keep_rows(self, rows: list[int]) -> None:
        if not rows:
            return
        self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.draft.device))
        self.keys = self.keys[rows]
        self.unfed = [self.unfed[r] for r in rows]
        self.fed_slots = [self.fed_slots[r] for r in rows]

    def stats(self) -> dict[str, float]:
        return {}

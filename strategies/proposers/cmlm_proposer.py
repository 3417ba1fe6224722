"""The CMLM as a drafter (SpecDec's Spec-Drafter): k masked tokens after the row's context, one forward.

The draft model (`draft_model.py`) pays one forward per drafted token; a non-autoregressive
drafter fills all k positions of `[context ; LENGTH ; <len_k> ; mask × k]` at once (each position's
argmax; no refinement pass). Context tokens the CMLM has not seen yet (the pending token and what
the last step emitted) are fed in the same forward and stay in its cache; the block's slots do not.

Drafts are deterministic, so they are verified by exact matching (lossless, greedy or sampled:
`speculative` with `strategy.speculative.drafter=cmlm`) or by SpecDec's relaxed rule (`specdec`
with `strategy.specdec.drafter=cmlm`, greedy only).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from strategies.artifacts.cmlm import CMLM
from strategies.base import GenerationParams
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, TargetStates


class CMLMProposer:
    name = "cmlm"
    wants_states = False
    model: ClassVar[str] = "cmlm"  # the `model.<kind>` it drafts with
    draft_probabilities: ClassVar[bool] = False  # drafts carry q, as speculative sampling needs

    def __init__(self, cmlm: CMLM, vocab_size: int) -> None:
        if cmlm.config.content_vocab_size > vocab_size:
            raise ValueError(
                f"the CMLM's content vocabulary ({cmlm.config.content_vocab_size}) is larger than the target's "
                f"({vocab_size}): model.cmlm must be distilled for a target of this tokenizer"
            )
        self.cmlm = cmlm

    def start(
        self, contexts: list[list[int]], keys: torch.Tensor, params: GenerationParams, states: TargetStates | None
    ) -> None:
        self.eos = frozenset() if params.ignore_eos else params.eos_token_ids
        self.contexts = [list(c) for c in contexts]
        self.kv = self.cmlm.new_kv(len(contexts))
        self.fed = [0] * len(contexts)  # context tokens in the CMLM's cache

    def add_rows(self, contexts: list[list[int]], keys: torch.Tensor, states: TargetStates | None) -> None:
        self.kv.extend(self.cmlm.new_kv(len(contexts)))  # their context is fed at the next draft
        self.contexts += [list(c) for c in contexts]
        self.fed += [0] * len(contexts)

    def propose(self, context: ProposalContext) -> list[Draft]:
        k = min(max(context.budgets), self.cmlm.max_length)
        if k == 0:
            return [Draft.empty() for _ in self.contexts]
        feeds = [ctx[fed:] for ctx, fed in zip(self.contexts, self.fed, strict=True)]
        mask = self.cmlm.config.mask_token_id
        states = self.cmlm.read(self.kv, feeds, [[mask] * k for _ in feeds]).states  # [B, k, H]
        _, best = self.cmlm.best_tokens(states, torch.ones(states.shape[:2], dtype=torch.bool))  # [B, k]
        self.fed = [len(ctx) for ctx in self.contexts]
        drafts = []
        for row, tokens in enumerate(best.tolist()):
            chain = []
            for token in tokens[: context.budgets[row]]:
                chain.append(token)
                if token in self.eos:
                    break
            drafts.append(Draft.chain(chain))
        return drafts

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        for ctx, tokens in zip(self.contexts, emitted, strict=True):
            ctx.extend(tokens)

    def keep_rows(self, rows: list[int]) -> None:
        if not rows:
            return
        self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.kv.valid.device))
        self.contexts = [self.contexts[r] for r in rows]
        self.fed = [self.fed[r] for r in rows]

    def stats(self) -> dict[str, float]:
        return {}

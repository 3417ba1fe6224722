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

from dataclasses import dataclass

import torch

from strategies.artifacts.cmlm import CMLM
from strategies.base import GenerationParams
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


@dataclass
class _CMLMRow:
    context: list[int]  # prompt and generated tokens, the pending one last
    fed: int = 0  # context tokens in the CMLM's cache (a joining row's are fed at its next draft)


class CMLMProposer(Proposer[_CMLMRow]):
    name = "cmlm"  # the `strategy.<name>.drafter` value (`strategies.methods.chain`)

    def __init__(self, cmlm: CMLM, vocab_size: int) -> None:
        if cmlm.config.content_vocab_size > vocab_size:
            raise ValueError(
                f"the CMLM's content vocabulary ({cmlm.config.content_vocab_size}) is larger than the target's "
                f"({vocab_size}): model.cmlm must be distilled for a target of this tokenizer"
            )
        self.cmlm = cmlm

    def start(self, contexts: list[list[int]], params: GenerationParams, states: TargetStates | None) -> None:
        super().start(contexts, params, states)
        self.eos = frozenset() if params.ignore_eos else params.eos_token_ids
        self.kv = self.cmlm.new_kv(len(contexts))  # [B] rows, in the records' order

    def add_rows(self, contexts: list[list[int]], states: TargetStates | None) -> None:
        super().add_rows(contexts, states)
        self.kv.extend(self.cmlm.new_kv(len(contexts)))

    def new_row_state(self, context: list[int]) -> _CMLMRow:
        return _CMLMRow(list(context))

    def keep_rows(self, rows: list[int]) -> None:
        super().keep_rows(rows)
        if rows:
            self.kv.select_rows(torch.tensor(rows, dtype=torch.long, device=self.kv.valid.device))

    def propose(self, context: ProposalContext) -> list[Draft]:
        k = min(max(context.budgets), self.cmlm.max_length)
        if k == 0:
            return [Draft.empty() for _ in self.rows]
        feeds = [row.context[row.fed :] for row in self.rows]
        mask = self.cmlm.config.mask_token_id
        states = self.cmlm.read(self.kv, feeds, [[mask] * k for _ in feeds]).states  # [B, k, H]
        _, best = self.cmlm.best_tokens(states, torch.ones(states.shape[:2], dtype=torch.bool))  # [B, k]
        for row in self.rows:
            row.fed = len(row.context)
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
        for row, tokens in zip(self.rows, emitted, strict=True):
            row.context.extend(tokens)

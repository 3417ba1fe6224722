"""Medusa (Cai et al. 2024) and blockwise parallel decoding (Stern et al. 2018): drafts from heads on
the target's own last hidden state.

The row's pending token is the target's choice from its state h_t; head i guesses the token after
that at depth i+1 (`heads.DraftHeads`). Medusa drafts a tree: `choices` are paths of ranks, (0, 1)
being the top-1 of head 0 and below it the top-2 of head 1, whatever the row; blockwise decoding
drafts the chain of each head's top-1, which is the tree [(0,), (0, 0), (0, 0, 0), …]. Both are one
`HeadsProposer`: the heads cost one small forward per step, with no cache of their own, so drafting
costs almost nothing next to a draft model and acceleration can survive larger batches.

`choices` are listed most valuable first, each path after its prefix: a budget of n nodes keeps the
first n, and a row with less room keeps the paths that fit.
"""

from __future__ import annotations

import torch

from strategies.artifacts.heads import DraftHeads
from strategies.proposers.medusa_choices import Path
from strategies.runtime import linear
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


class HeadsProposer(Proposer[None]):
    """Drafts `choices` from each row's last target state through the heads. It keeps nothing per row:
    the states it drafts from are the batch's (`ProposalContext.states`)."""

    wants_hidden_states = True

    def __init__(self, name: str, heads: DraftHeads, choices: list[list[int]]) -> None:
        self.name = name
        self.heads = heads
        self.choices: list[Path] = [tuple(c) for c in choices]
        self.max_rank = max(max(c) for c in self.choices) + 1
        if heads is not None:  # None: a subclass that ranks its candidates itself
            if self.max_rank > heads.drafted_tokens:
                drafted = heads.drafted_tokens
                raise ValueError(f"{name}: its tree ranks {self.max_rank} tokens of a head, the heads draft {drafted}")
            if heads.draft_lm_head is not None:
                # Packed with its strategy, after the runner chose its kernels, not on the first draft, which
                # the controller explores the heads with (the whole LM head's copies are the target's own).
                linear.prepack([heads.draft_lm_head])
        self._shapes: dict[tuple[int, int], tuple[list[Path], list[int]]] = {}

    def new_row_state(self, context: list[int]) -> None:
        return None

    def _shape(self, depth: int, nodes: int) -> tuple[list[Path], list[int]]:
        """The paths of a tree of at most `nodes` nodes and `depth` levels, and each one's parent index."""
        key = (depth, nodes)
        if key not in self._shapes:
            paths = [p for p in self.choices if len(p) <= depth][:nodes]
            index = {p: i for i, p in enumerate(paths)}
            self._shapes[key] = (paths, [index.get(p[:-1], -1) for p in paths])
        return self._shapes[key]

    @torch.inference_mode()
    def candidates(self, context: ProposalContext) -> list[list[list[int]]]:
        """[k][B][R]: the best `max_rank` tokens of each head the draft reaches, per row, best first."""
        depth = max(len(p) for p in self._shape(max(context.budgets), context.max_nodes)[0])
        hidden = context.states.last()  # [B, H] the state that chose each row's pending token
        logits = self.heads.draft_logits(hidden, depth)  # [k, B, N] over the draft vocabulary
        return self.heads.to_target(logits.topk(self.max_rank, dim=-1).indices).tolist()

    def propose(self, context: ProposalContext) -> list[Draft]:
        ranked = self.candidates(context)  # [k][B][R]
        drafts = []
        for row, budget in enumerate(context.budgets):
            paths, parents = self._shape(budget, context.max_nodes)
            tokens = [ranked[len(p) - 1][row][p[-1]] for p in paths]
            drafts.append(Draft(tokens, list(parents)))
        return drafts

"""The proposer contract: drafts below each row's pending token, told afterwards what was emitted.

A proposer never touches the target model or its cache. The speculative loop asks it for one
`Draft` per row, verifies all rows in one target forward, and reports each row's emitted tokens
(accepted draft tokens, then the target's token, which becomes the next pending token). A proposer
that raises, or returns a draft that fails `drafts.draft_problem`, costs that step its speed-up,
never a row: the rows concerned take one ordinary autoregressive step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from strategies.base import GenerationParams
from strategies.drafts import Draft


@dataclass
class ProposalContext:
    generated: list[int]  # per row: tokens generated so far, the pending one included
    budgets: list[int]  # per row: deepest useful draft path (0: no draft for this row)
    max_nodes: int  # most draft nodes per row (trees)


class Proposer(Protocol):
    name: str

    def start(self, contexts: list[list[int]], keys: torch.Tensor, params: GenerationParams) -> None:
        """The first step of a batch that uses this proposer (not always the batch's first step: a
        controller may start it later): per active row its prompt and generated tokens, the last
        being the pending token (not yet in the target's cache); `keys` [B] are the rows' sampling keys."""

    def propose(self, context: ProposalContext) -> list[Draft]:
        """One draft per row below its pending token. Not called on steps that do not speculate."""

    def accepted(self, emitted: list[list[int]]) -> None:
        """Per row, the tokens emitted this step (every step, drafted or not); the last one is the
        row's new pending token."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows (batch indices, in order) stay in the batch; the others finished (maybe all)."""

    def stats(self) -> dict[str, float]:
        """Proposer-specific numbers for the batch's throughput record (e.g. the trie's size)."""

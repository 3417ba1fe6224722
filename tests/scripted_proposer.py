"""A proposer for tests that knows the greedy continuation: always right, or never the target's argmax."""

from __future__ import annotations

from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


class ScriptedProposer(Proposer[int]):
    """Drafts `reference[row][generated : generated + budget]` (right) or each of those tokens + 1 (wrong).

    `fail_at`: the number of the `propose` call that raises instead. Rows are known by their batch
    index at `start`, so it must start while every row of the batch is still decoding.
    """

    name = "scripted"

    def __init__(self, reference: list[list[int]], vocab_size: int, right: bool = True, fail_at: int | None = None):
        self.reference, self.vocab_size, self.right, self.fail_at = reference, vocab_size, right, fail_at
        self.calls = 0

    def start(self, contexts, params, states) -> None:
        self.rows = list(range(len(contexts)))  # each row's index in `reference`

    def propose(self, context: ProposalContext) -> list[Draft]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("proposer broke")
        drafts = []
        for row, g, budget in zip(self.rows, context.num_generated, context.budgets, strict=True):
            truth = self.reference[row][g : g + budget]
            drafts.append(Draft.chain(truth if self.right else [(t + 1) % self.vocab_size for t in truth]))
        return drafts

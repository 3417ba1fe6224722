"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the row's last n tokens.

Code, extraction and summaries copy from their prompt; the row's own context is the draft model.
Each row keeps an index n-gram -> start of its latest occurrence that has a continuation, updated
as tokens arrive, so a lookup is one dictionary probe per n, longest n first.
"""

from __future__ import annotations

from strategies.runtime.target_states import TargetStates
from strategies.verification.drafts import Draft
from strategies.verification.proposer import ProposalContext, Proposer


class NgramIndex:
    """Latest start position of every n-gram (min_n..max_n) of a growing token list, continuation known."""

    def __init__(self, tokens: list[int], min_n: int, max_n: int) -> None:
        self.tokens: list[int] = []
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # n-grams ending just before `token` now have a continuation
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.latest[tuple(self.tokens[end - n : end])] = end - n
            self.tokens.append(token)

    def continuation(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self.latest.get(tuple(self.tokens[size - n :]))
            if start is not None:
                return self.tokens[start + n : start + n + k]
        return []


class PromptLookupProposer(Proposer[NgramIndex]):
    """Each row's record is the n-gram index of its context."""

    name = "prompt_lookup"

    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def new_row_state(self, context: list[int]) -> NgramIndex:
        return NgramIndex(context, self.min_ngram, self.max_ngram)

    def propose(self, context: ProposalContext) -> list[Draft]:
        return [
            Draft.chain(index.continuation(budget) if budget else [])
            for index, budget in zip(self.rows, context.budgets, strict=True)
        ]

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        # Indexed as tokens arrive (a run of plain steps reports its tokens at once), not at the next
        # proposal: a probe after a long run would carry the run's indexing and look dearer than it is.
        for index, tokens in zip(self.rows, emitted, strict=True):
            index.extend(tokens)

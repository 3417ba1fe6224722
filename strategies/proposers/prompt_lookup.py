"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the row's last n tokens.

Code, extraction and summaries copy from their prompt; the row's own context is the draft model.
Each row keeps an index n-gram -> start of its latest occurrence that has a continuation, updated
as tokens arrive, so a lookup is one dictionary probe per n, longest n first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strategies.proposers.draft_sizing import AcceptanceRecord
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

    def match(self) -> tuple[int, int] | None:
        """(n, start) of the latest earlier occurrence of the longest suffix n-gram that has one, else None."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self.latest.get(tuple(self.tokens[size - n :]))
            if start is not None:
                return n, start
        return None

    def continuation(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        return self.copy_after(self.match(), k)

    def copy_after(self, found: tuple[int, int] | None, k: int) -> list[int]:
        """Up to k tokens that followed the occurrence `found` (n, start) of `match`.

        Where that occurrence is so recent that its continuation runs into the suffix itself, the
        text repeats with a period of (suffix start - occurrence start) tokens, and the copy goes on
        from the tokens it has just drafted: a loop drafts as far as asked, not only to the end of
        what was written. Small models fall into such loops, and greedy decoding keeps them.
        """
        if found is None:
            return []
        n, start = found
        source, size = start + n, len(self.tokens)
        drafted: list[int] = []
        for i in range(k):
            j = source + i  # the token that followed position j - 1 in the occurrence
            drafted.append(self.tokens[j] if j < size else drafted[j - size])
        return drafted


@dataclass
class LookupRow:
    """A row's n-gram index, and the kind and tokens of its draft awaiting its verdict."""

    index: NgramIndex
    pending: tuple[tuple[bool, int], list[int]] | None = None


class PromptLookupProposer(Proposer[LookupRow]):
    """Each row's record is the n-gram index of its context.

    With `sizing` (`draft_sizing.AcceptanceRecord`), the batch's drafts are cut to the depth their
    kinds pay for: a draft's kind is whether the match lies in the row's own output or in its prompt,
    and the match's length n. Without, every draft is as long as the step asks.
    """

    name = "prompt_lookup"

    def __init__(
        self, min_ngram: int, max_ngram: int, sizing: AcceptanceRecord | None = None, step_costs: Sequence[float] = ()
    ) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.sizing = sizing
        self.step_costs = list(step_costs)  # cost(k), plain steps, where the controller gives none (`ProposalContext`)
        self.sizes_own_drafts = sizing is not None

    def new_row_state(self, context: list[int]) -> LookupRow:
        return LookupRow(NgramIndex(context, self.min_ngram, self.max_ngram))

    def propose(self, context: ProposalContext) -> list[Draft]:
        found = []  # per row: its draft's tokens and kind (in its own output, match length)
        for row, budget, generated in zip(self.rows, context.budgets, context.num_generated, strict=True):
            match = row.index.match() if budget else None
            tokens = row.index.copy_after(match, budget)
            found.append((tokens, (match[1] >= len(row.index.tokens) - generated, match[0]) if tokens else None))
        if self.sizing is not None:
            costs = context.step_costs or self.step_costs
            depth = self.sizing.depth([(kind, len(tokens)) for tokens, kind in found if tokens], len(found), costs)
            found = [(tokens[:depth], kind) for tokens, kind in found]
            for row, (tokens, kind) in zip(self.rows, found, strict=True):
                row.pending = (kind, tokens) if tokens else None
        return [Draft.chain(tokens) for tokens, _ in found]

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        # Indexed as tokens arrive (a run of plain steps reports its tokens at once), not at the next
        # proposal: a probe after a long run would carry the run's indexing and look dearer than it is.
        for row, tokens in zip(self.rows, emitted, strict=True):
            if row.pending is not None:
                kind, draft = row.pending
                # The accepted draft tokens lead the emitted ones (a row that ends mid-step emits fewer).
                accepted, verified = 0, min(len(draft), len(tokens) - 1)
                while accepted < verified and draft[accepted] == tokens[accepted]:
                    accepted += 1
                self.sizing.record(kind, len(draft), accepted)
                row.pending = None
            row.index.extend(tokens)

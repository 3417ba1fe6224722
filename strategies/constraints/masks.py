"""The grammar's masks on the target's logits: each constrained slot keeps only the tokens its row's
grammar allows there, the others at -inf (so no later control can bring one back).

A plain step's slot follows the row's output (`constrain`); a verify forward's slot j follows the row's
output and the draft's path to node j (`slot_masks`: a depth-first walk of the draft that advances the
row's matcher down each path and rolls it back). A grammar that allows no token at all (it was left by
a token it refused) allows the row's end tokens, so the row finishes rather than choosing at random.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

from strategies.verification.drafts import Draft


class Matcher(Protocol):
    """A row's place in its grammar (`grammars.RowMatcher`)."""

    ends: frozenset[int]

    def accepts(self, token: int) -> bool: ...

    def advance(self, token: int) -> None: ...

    def back(self, count: int) -> None: ...

    def fill(self, bitmask: torch.Tensor) -> None: ...


def words(vocab_size: int) -> int:
    """Int32 words of one slot's bitmask."""
    return (vocab_size + 31) // 32


def new_bitmasks(slots: int, vocab_size: int) -> torch.Tensor:
    """[slots, words] int32, every token allowed: a slot no matcher fills stays unconstrained."""
    return torch.full((slots, words(vocab_size)), -1, dtype=torch.int32)


def allowed(bitmasks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] bool: the tokens `bitmasks` [N, words] allow."""
    bits = torch.arange(32, dtype=torch.int32)
    return ((bitmasks[:, :, None] >> bits) & 1).bool().reshape(len(bitmasks), -1)[:, :vocab_size]


def apply(
    logits: torch.Tensor, slots: Sequence[int], bitmasks: torch.Tensor, ends: Sequence[frozenset[int]]
) -> torch.Tensor:
    """`logits` [N, V] with rows `slots` kept to what `bitmasks` [len(slots), words] allow; `ends`: per
    masked slot, the tokens a slot that allows nothing allows instead."""
    keep = allowed(bitmasks, logits.shape[-1])  # [S, V]
    for s in torch.nonzero(~keep.any(dim=1)).flatten().tolist():
        keep[s, sorted(ends[s])] = True
    index = torch.tensor(list(slots), dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[index] = out[index].masked_fill(~keep.to(logits.device), -math.inf)
    return out


def constrain(logits: torch.Tensor, matchers: Sequence[Matcher | None]) -> torch.Tensor:
    """[B, V] logits of each row's next token kept inside its grammar (rows without one as they are)."""
    rows = [b for b, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    bitmasks = new_bitmasks(len(rows), logits.shape[-1])
    for s, b in enumerate(rows):
        matchers[b].fill(bitmasks[s])
    return apply(logits, rows, bitmasks, [matchers[b].ends for b in rows])


def children(draft: Draft) -> list[list[int]]:
    """Per node, then last the pending token's: the nodes hanging below it."""
    below: list[list[int]] = [[] for _ in range(len(draft) + 1)]
    for node, parent in enumerate(draft.parents):
        below[parent].append(node)  # parent -1: the pending token's, the last list
    return below


def slot_masks(matcher: Matcher, draft: Draft, bitmasks: torch.Tensor) -> None:
    """Fill `bitmasks` [1 + len(draft), words]: slot 0 what the grammar allows after the row's output,
    slot i + 1 what it allows after the draft's path to node i. A node the grammar refuses, and its
    subtree, keep every token: their slots are never reached (the slot above refuses the node). The
    matcher ends where it began."""
    below = children(draft)
    matcher.fill(bitmasks[0])

    def descend(parent: int) -> None:
        for node in below[parent]:
            if matcher.accepts(draft.tokens[node]):
                matcher.advance(draft.tokens[node])
                matcher.fill(bitmasks[node + 1])
                descend(node)
                matcher.back(1)

    descend(-1)


def draft_logits(logits: torch.Tensor, matchers: Sequence[Matcher | None], drafts: Sequence[Draft]) -> torch.Tensor:
    """[B, W, V] a verify forward's logits with each constrained row's slots inside its grammar."""
    b, w, v = logits.shape
    rows = [r for r, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    slots, ends, blocks = [], [], []
    for r in rows:
        block = new_bitmasks(1 + len(drafts[r]), v)
        slot_masks(matchers[r], drafts[r], block)
        slots += range(r * w, r * w + len(block))
        ends += [matchers[r].ends] * len(block)
        blocks.append(block)
    return apply(logits.reshape(b * w, v), slots, torch.cat(blocks), ends).view(b, w, v)

"""The grammar's masks on the target's logits: each constrained slot keeps only the tokens its row's
grammar allows there, the others at -inf (so no later control can bring one back).

A plain step's slot follows the row's output (`constrain`); a verify forward's slots follow the draft's
paths too (`strategies.constraints.drafts`). A grammar that allows no token at all (it was left by a
token it refused) allows the row's end tokens, so the row finishes rather than choosing at random.
This module knows nothing of drafts: the runtime's plain steps use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch


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

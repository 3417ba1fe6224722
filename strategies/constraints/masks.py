"""The grammar's masks on the target's logits: each constrained slot keeps only the tokens its row's
grammar allows there, the others at -inf (so no later control can bring one back).

A plain step's slot follows the row's output (`constrain`); a verify forward's slots follow the draft's
paths too (`strategies.constraints.drafts`). At temperature 0 only the choice matters, so a slot is
masked only where the grammar refuses its argmax (`needs_mask`). A grammar that allows no token at all (it was left by a
token it refused) allows the row's end tokens, so the row finishes rather than choosing at random.
This module knows nothing of drafts: the runtime's plain steps use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch


class Matcher(Protocol):
    """A row's place in its grammar (`grammars.RowMatcher`)."""

    ends: frozenset[int]

    def accepts(self, token: int) -> bool: ...

    def advance(self, token: int) -> None: ...

    def back(self, count: int) -> None: ...

    def fill(self, bitmask: torch.Tensor) -> None: ...


def needs_mask(matcher: Matcher, best: Sequence[int] | None, slot: int) -> bool:
    """Whether a slot must be masked: always when sampling (`best` None); at temperature 0 only where
    the grammar refuses the slot's argmax `best[slot]`. Checking a token costs about a microsecond where
    filling a mask costs some thirty, and a model that follows the format rarely has its argmax refused."""
    return best is None or not matcher.accepts(best[slot])


def words(vocab_size: int) -> int:
    """Int32 words of one slot's bitmask."""
    return (vocab_size + 31) // 32


def new_bitmasks(slots: int, vocab_size: int) -> torch.Tensor:
    """[slots, words] int32, every token allowed: a slot no matcher fills stays unconstrained."""
    return torch.full((slots, words(vocab_size)), -1, dtype=torch.int32)


def allowed(bitmasks: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] bool: the tokens `bitmasks` [N, words] allow. The matchers fill masks in host memory, and
    numpy unpacks a byte's bits in one pass (bit j of a little-endian word's byte b: token 8b + j)."""
    as_bytes = bitmasks.contiguous().numpy().view(np.uint8)  # [N, 4 * words]
    return torch.from_numpy(np.unpackbits(as_bytes, axis=1, bitorder="little")[:, :vocab_size].view(np.bool_))


def apply(
    logits: torch.Tensor, slots: Sequence[int], bitmasks: torch.Tensor, ends: Sequence[frozenset[int]]
) -> torch.Tensor:
    """`logits` [N, V] with rows `slots` kept to what `bitmasks` [len(slots), words] allow; `ends`: per
    masked slot, the tokens a slot that allows nothing allows instead."""
    empty = (bitmasks == 0).all(dim=1)  # [S]: slots whose grammar allows nothing
    if bool(empty.any()):
        bitmasks = bitmasks.clone()  # the caller's masks stay what the grammars said
        for s in torch.nonzero(empty).flatten().tolist():
            for token in ends[s]:
                bitmasks[s, token // 32] |= 1 << (token % 32) if token % 32 < 31 else -(1 << 31)
    keep = allowed(bitmasks, logits.shape[-1]).to(logits.device)  # [S, V]
    refused = torch.tensor(-math.inf, dtype=logits.dtype, device=logits.device)
    if list(slots) == list(range(len(logits))):  # every row masked (a plain step's usual case): no gather
        return torch.where(keep, logits, refused)
    index = torch.tensor(list(slots), dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[index] = torch.where(keep, out[index], refused)
    return out


def constrain(
    logits: torch.Tensor, matchers: Sequence[Matcher | None], best: Sequence[int] | None = None
) -> torch.Tensor:
    """[B, V] logits of each row's next token kept inside its grammar (rows without one as they are).
    `best`, at temperature 0: each row's argmax of `logits`; a row whose grammar allows it is left as
    it is, since the argmax of its allowed tokens is that token already (`needs_mask`)."""
    rows = [b for b, m in enumerate(matchers) if m is not None and needs_mask(m, best, b)]
    if not rows:
        return logits
    bitmasks = new_bitmasks(len(rows), logits.shape[-1])
    for s, b in enumerate(rows):
        matchers[b].fill(bitmasks[s])
    return apply(logits, rows, bitmasks, [matchers[b].ends for b in rows])

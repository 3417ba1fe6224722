"""The grammar's masks on the target's logits: each constrained slot keeps only the tokens its row's
grammar allows there, the others at -inf (so no later control can bring one back).

A plain step's slot follows the row's output (`constrain`); a verify forward's slots follow the draft's
paths too (`strategies.constraints.drafts`). At temperature 0 only the choice matters, so a slot is
masked only where the grammar refuses its argmax (`needs_mask`). A grammar that allows no token at all (it was left by a
token it refused) allows the row's end tokens, so the row finishes rather than choosing at random.
This module knows nothing of drafts: the runtime's plain steps use it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F


class Matcher(Protocol):
    """A row's place in its grammar (`grammars.RowMatcher`)."""

    ends: frozenset[int]

    def accepts(self, token: int) -> bool: ...

    def advance(self, token: int) -> None: ...

    def back(self, count: int) -> None: ...

    def fill(self, bitmask: torch.Tensor) -> None: ...

    def forced(self) -> list[int]: ...


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


@functools.cache
def _byte_biases(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: for each value of a bitmask's byte, the additive bias of the 8 tokens it names (bit j:
    the byte's token j), 0 where allowed and -inf where refused."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")  # [256, 8]
    return torch.tensor(np.where(bits == 1, 0.0, -np.inf), dtype=dtype, device=device)


def biases(bitmasks: torch.Tensor, vocab_size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[N, V] the additive bias of `bitmasks` [N, words]: 0 where a token is allowed, -inf where refused.
    Each byte of the masks (bit j of a little-endian word's byte b: token 8b + j) looks its 8 biases up
    in one table: a masked `where` over the vocabulary branches on every token and costs some four
    times as much on a CPU."""
    as_bytes = torch.from_numpy(bitmasks.contiguous().numpy().view(np.uint8)).to(device, torch.long)  # [N, 4 * words]
    return F.embedding(as_bytes, _byte_biases(dtype, device)).flatten(1)[:, :vocab_size]


def apply(
    logits: torch.Tensor, slots: Sequence[int], bitmasks: torch.Tensor, ends: Sequence[frozenset[int]]
) -> torch.Tensor:
    """`logits` [N, V] with rows `slots` kept to what `bitmasks` [len(slots), words] allow; `ends`: per
    masked slot, the tokens a slot that allows nothing allows instead."""
    empty = ~bitmasks.any(dim=1)  # [S]: slots whose grammar allows nothing
    if bool(empty.any()):
        bitmasks = bitmasks.clone()  # the caller's masks stay what the grammars said
        for s in torch.nonzero(empty).flatten().tolist():
            for token in ends[s]:
                bitmasks[s, token // 32] |= 1 << (token % 32) if token % 32 < 31 else -(1 << 31)
    bias = biases(bitmasks, logits.shape[-1], logits.dtype, logits.device)  # [S, V]
    if list(slots) == list(range(len(logits))):  # every row masked (a plain step's usual case): no gather
        return logits + bias
    index = torch.tensor(list(slots), dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[index] += bias
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
    # Every row's mask, a row left unmasked allowing all: one bias over the batch costs less than
    # picking the masked rows out and back.
    bitmasks = new_bitmasks(len(logits), logits.shape[-1])
    for b in rows:
        matchers[b].fill(bitmasks[b])
    ends = [frozenset() if m is None else m.ends for m in matchers]
    return apply(logits, range(len(logits)), bitmasks, ends)

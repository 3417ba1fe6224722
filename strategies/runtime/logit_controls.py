"""A row's sampling controls: penalties, min_p, min_tokens, stop token ids and logit bias, applied to
the target's logits before a token is chosen from them (greedy or sampled).

Each control reads the row's own history (its prompt, its output so far), so they are applied per row
at each slot where a token is chosen: a plain step's one slot, or every slot of a verify forward, where
slot j of a draft sees the row's output followed by the draft tokens on the path to it (`slot_outputs`).
Rows of one batch may carry different controls (each `RowRequest.controls`); rows without any keep
their logits untouched, and a batch where no row has any pays nothing.

Order, as vLLM's: logit bias, the min_tokens mask, the repetition penalty, the frequency and presence
penalties, then (sampling only) min_p, which keeps a token when its probability at the row's temperature
is at least min_p times the most likely token's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strategies.base import LogitControls

if TYPE_CHECKING:
    from strategies.base import GenerationParams, RowRequest


@dataclass(frozen=True)
class SlotHistory:
    """What the token chosen at one slot follows: the row's controls, prompt and output so far."""

    controls: LogitControls
    prompt: Sequence[int]
    output: Sequence[int]


def control_logits(
    logits: torch.Tensor, slots: Sequence[SlotHistory | None], ends: frozenset[int], temperature: float
) -> torch.Tensor:
    """`logits` [N, V] with each slot's controls applied (a None slot, or one asking nothing, is left
    as it is); `ends`: the tokens min_tokens holds back besides the row's stop_token_ids (EOS)."""
    if all(s is None or s.controls.asks_nothing() for s in slots):
        return logits
    out = logits.clone()
    for n, slot in enumerate(slots):
        if slot is not None and not slot.controls.asks_nothing():
            out[n] = _controlled(out[n], slot, ends, temperature)
    return out


def _controlled(row: torch.Tensor, slot: SlotHistory, ends: frozenset[int], temperature: float) -> torch.Tensor:
    c, device = slot.controls, row.device
    if c.logit_bias:
        ids, biases = zip(*c.logit_bias, strict=True)
        row = row.index_add(0, torch.tensor(ids, device=device), torch.tensor(biases, dtype=row.dtype, device=device))
    if len(slot.output) < c.min_tokens:
        held = sorted(ends | set(c.stop_token_ids))
        row = row.index_fill(0, torch.tensor(held, dtype=torch.long, device=device), -math.inf)
    if c.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*slot.prompt, *slot.output}), dtype=torch.long, device=device)
        values = row[seen]
        row = row.index_copy(
            0, seen, torch.where(values > 0, values / c.repetition_penalty, values * c.repetition_penalty)
        )
    if (c.frequency_penalty or c.presence_penalty) and slot.output:
        counts = Counter(slot.output)
        ids = torch.tensor(list(counts), dtype=torch.long, device=device)
        times = torch.tensor(list(counts.values()), dtype=row.dtype, device=device)
        row = row.index_add(0, ids, -(c.frequency_penalty * times + c.presence_penalty))
    if c.min_p > 0 and temperature > 0:
        # p(x) < min_p · p_max  <=>  logit(x) < logit_max + T·ln(min_p), at temperature T
        row = row.masked_fill(row < row.max() + temperature * math.log(c.min_p), -math.inf)
    return row


def min_tokens_ends(params: GenerationParams) -> frozenset[int]:
    """The end tokens min_tokens holds back: EOS, unless the job generates past it anyway."""
    return frozenset() if params.ignore_eos else params.eos_token_ids


def next_token_logits(
    logits: torch.Tensor, requests: Sequence[RowRequest], outputs: Sequence[Sequence[int]], params: GenerationParams
) -> torch.Tensor:
    """[B, V] logits of each row's next token, under its controls: row b's output so far is `outputs[b]`."""
    if all(r.controls is None for r in requests):
        return logits
    slots = [
        None if r.controls is None else SlotHistory(r.controls, r.prompt, out)
        for r, out in zip(requests, outputs, strict=True)
    ]
    return control_logits(logits, slots, min_tokens_ends(params), params.sampling.temperature)

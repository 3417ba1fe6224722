"""A row's sampling controls: penalties, min_p, min_tokens, stop token ids and logit bias, applied to
the target's logits before a token is chosen from them (greedy or sampled).

Each control reads the row's own history (its prompt, its output so far), so they are applied per row
at each slot where a token is chosen: a plain step's one slot, or every slot of a verify forward, where
slot j of a draft sees the row's output followed by the draft tokens on the path to it (`slot_paths`).
Rows of one batch may carry different controls (each `RowRequest.controls`); rows without any keep
their logits untouched, and a batch where no row has any pays nothing.

Order, as vLLM's: logit bias, the min_tokens mask, the repetition penalty, the frequency and presence
penalties, then (sampling only) min_p, which keeps a token when its probability at the row's temperature
is at least min_p times the most likely token's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strategies.base import LogitControls

if TYPE_CHECKING:
    from strategies.base import GenerationParams, RowRequest


@dataclass(frozen=True)
class RowSlots:
    """One row's slots among a forward's logits: `paths[j]`, the tokens slot `first + j` follows past the
    row's `output` (a plain step's one slot: none; a verify forward's slot j + 1: the draft's path to
    node j). The row's history is shared by its slots, and each control reads it once per forward,
    whatever the number of slots."""

    controls: LogitControls
    prompt: Sequence[int]
    output: Sequence[int]
    first: int
    paths: Sequence[Sequence[int]]


def control_logits(
    logits: torch.Tensor, rows: Sequence[RowSlots], ends: frozenset[int], temperature: float
) -> torch.Tensor:
    """`logits` [N, V] with each row's controls applied to its slots (slots of no row, and rows asking
    nothing, are left as they are); `ends`: the tokens min_tokens holds back besides the row's
    stop_token_ids (EOS)."""
    rows = [r for r in rows if not r.controls.asks_nothing() and r.paths]
    if not rows:
        return logits
    out = logits.clone()  # one copy, each row's slots then changed in place: [W, V] copies cost page faults
    for row in rows:
        _control(out[row.first : row.first + len(row.paths)], row, ends, temperature)
    return out


def _control(logits: torch.Tensor, row: RowSlots, ends: frozenset[int], temperature: float) -> None:
    """Apply one row's controls to its slots' logits [W, V], in place. Each token a slot's history holds
    is penalized from its count in the whole history (output and path), as a plain step at that point
    would be: one subtraction of the whole penalty, so a verify slot's logits equal the plain step's
    bit for bit."""
    c, device = row.controls, logits.device
    if c.logit_bias:
        ids, biases = zip(*c.logit_bias, strict=True)
        bias = torch.tensor(biases, dtype=logits.dtype, device=device)[None].expand(len(logits), -1)
        logits.index_add_(1, torch.tensor(ids, device=device), bias)
    short = [j for j, path in enumerate(row.paths) if len(row.output) + len(path) < c.min_tokens]
    if short:
        held = torch.tensor(sorted(ends | set(c.stop_token_ids)), dtype=torch.long, device=device)
        rows = logits.index_select(0, torch.tensor(short, device=device))
        logits.index_copy_(0, torch.tensor(short, device=device), rows.index_fill_(1, held, -math.inf))
    if c.repetition_penalty != 1.0:
        _repetition(logits, row, c.repetition_penalty)
    if c.frequency_penalty or c.presence_penalty:
        _frequency_presence(logits, row, c.frequency_penalty, c.presence_penalty)
    if c.min_p > 0 and temperature > 0:
        # p(x) < min_p · p_max  <=>  logit(x) < logit_max + T·ln(min_p), at temperature T
        floor = logits.max(dim=-1, keepdim=True).values + temperature * math.log(c.min_p)
        logits.masked_fill_(logits < floor, -math.inf)


def _path_tokens(row: RowSlots, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (slot, token) of the row's paths, flat: slot indices [P] and tokens [P]."""
    slots = [j for j, path in enumerate(row.paths) for _ in path]
    tokens = [t for path in row.paths for t in path]
    return torch.tensor(slots, dtype=torch.long, device=device), torch.tensor(tokens, dtype=torch.long, device=device)


def _repetition(logits: torch.Tensor, row: RowSlots, penalty: float) -> None:
    """Every token of the prompt, the output or the slot's path divided by the penalty where positive,
    multiplied where not, in place: over the tokens any slot saw, [W, K] at once."""
    device = logits.device
    shared = torch.tensor([*row.prompt, *row.output], dtype=torch.long, device=device)
    path_slots, path_tokens = _path_tokens(row, device)
    touched = torch.unique(torch.cat([shared, path_tokens]))  # [K]
    seen = torch.isin(touched, shared)[None].repeat(len(logits), 1)  # [W, K]
    seen.view(-1).index_fill_(0, path_slots * len(touched) + torch.searchsorted(touched, path_tokens), True)
    values = logits.index_select(1, touched)
    penalized = torch.where(values > 0, values / penalty, values * penalty)
    logits.index_copy_(1, touched, torch.where(seen, penalized, values))


def _frequency_presence(logits: torch.Tensor, row: RowSlots, frequency: float, presence: float) -> None:
    """Each token less frequency × its count in the slot's output and path, and presence once if it is
    there, in place: over the tokens any slot's output holds, [W, K] at once."""
    device = logits.device
    output = torch.tensor(list(row.output), dtype=torch.long, device=device)
    path_slots, path_tokens = _path_tokens(row, device)
    touched = torch.unique(torch.cat([output, path_tokens]))  # [K]
    if not len(touched):
        return
    counts = torch.zeros(len(logits), len(touched), dtype=logits.dtype, device=device)  # [W, K]
    counts += torch.bincount(torch.searchsorted(touched, output), minlength=len(touched)).to(logits.dtype)
    ones = torch.ones(len(path_tokens), dtype=logits.dtype, device=device)
    counts.view(-1).index_add_(0, path_slots * len(touched) + torch.searchsorted(touched, path_tokens), ones)
    values = logits.index_select(1, touched)
    logits.index_copy_(1, touched, torch.where(counts > 0, values - (frequency * counts + presence), values))


def min_tokens_ends(params: GenerationParams) -> frozenset[int]:
    """The end tokens min_tokens holds back: EOS, unless the job generates past it anyway."""
    return frozenset() if params.ignore_eos else params.eos_token_ids


def next_token_logits(
    logits: torch.Tensor, requests: Sequence[RowRequest], outputs: Sequence[Sequence[int]], params: GenerationParams
) -> torch.Tensor:
    """[B, V] logits of each row's next token, under its controls: row b's output so far is `outputs[b]`."""
    if all(r.controls is None for r in requests):
        return logits
    rows = [
        RowSlots(r.controls, r.prompt, out, b, [()])
        for b, (r, out) in enumerate(zip(requests, outputs, strict=True))
        if r.controls is not None
    ]
    return control_logits(logits, rows, min_tokens_ends(params), params.sampling.temperature)

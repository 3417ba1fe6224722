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

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from strategies.base import GenerationParams, RowRequest
    from strategies.runtime.batch import Batch
    from strategies.verification.drafts import Draft


@dataclass(frozen=True)
class LogitControls:
    """What a row asks of its logits; the defaults ask for nothing."""

    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # tokens of prompt and output: positive logits divided, negative multiplied
    min_p: float = 0.0  # sampling: drop tokens less likely than min_p times the most likely
    min_tokens: int = 0  # EOS and stop_token_ids are impossible until this many tokens are generated
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the row (finish_reason stop), kept in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits

    def asks_nothing(self) -> bool:
        return self == LogitControls()


def logit_controls(settings: Any) -> LogitControls | None:
    """The controls a row's settings (`workers.common.row_settings.RowSettings`) ask for; None: none."""
    controls = LogitControls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(LogitControls)})
    return None if controls.asks_nothing() else controls


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


def slot_outputs(output: list[int], draft: Draft) -> list[list[int]]:
    """The output each verify slot's token follows: slot 0 (the pending token's) the row's `output`, its
    pending token last; slot i + 1 (node i's) that output and the draft's path down to node i."""
    paths: list[list[int]] = []
    for token, parent in zip(draft.tokens, draft.parents, strict=True):
        paths.append([*(paths[parent] if parent >= 0 else []), token])
    return [output, *([*output, *path] for path in paths)]


@dataclass(frozen=True)
class DraftControls:
    """The controls of a batch's rows, for a verify forward: what slot j of a row's draft follows is its
    output and the draft's path to slot j, so each slot's logits are controlled as plain decoding's
    would be had it emitted that path."""

    requests: Sequence[RowRequest]
    outputs: Sequence[list[int]]  # per row: generated so far, the pending token last
    params: GenerationParams

    @staticmethod
    def of(batch: Batch) -> DraftControls | None:
        """The controls of the batch's active rows, or None when no row has any."""
        requests = [row.request for row in batch.active]
        if all(r.controls is None for r in requests):
            return None
        return DraftControls(requests, [row.tokens for row in batch.active], batch.params)

    def apply(self, logits: torch.Tensor, drafts: Sequence[Draft]) -> torch.Tensor:
        """[B, W, V] a verify forward's logits under each row's controls, slot by slot (padding as it is)."""
        b, w, v = logits.shape
        slots: list[SlotHistory | None] = []
        for request, output, draft in zip(self.requests, self.outputs, drafts, strict=True):
            histories = [] if request.controls is None else slot_outputs(output, draft)
            slots += [SlotHistory(request.controls, request.prompt, h) for h in histories]
            slots += [None] * (w - len(histories))
        ends, temperature = min_tokens_ends(self.params), self.params.sampling.temperature
        return control_logits(logits.reshape(b * w, v), slots, ends, temperature).view(b, w, v)

"""A verify forward's logits under its rows' grammars and sampling controls: slot j of a row's draft
follows the row's output and the draft's path down to slot j, so each slot's logits are masked and
controlled as plain decoding's would be had it emitted that path (`strategies.constraints.masks`,
`strategies.runtime.logit_controls`), in the order plain steps take."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strategies.constraints.drafts import draft_logits
from strategies.constraints.masks import Matcher
from strategies.runtime.logit_controls import RowSlots, control_logits, min_tokens_ends

if TYPE_CHECKING:
    from strategies.base import GenerationParams, RowRequest
    from strategies.runtime.batch import Batch
    from strategies.verification.drafts import Draft


def slot_paths(draft: Draft) -> list[list[int]]:
    """What each verify slot's token follows past the row's output (its pending token last): slot 0 (the
    pending token's) nothing, slot i + 1 (node i's) the draft's path down to node i."""
    paths: list[list[int]] = []
    for token, parent in zip(draft.tokens, draft.parents, strict=True):
        paths.append([*(paths[parent] if parent >= 0 else []), token])
    return [[], *paths]


@dataclass(frozen=True)
class DraftControls:
    """The controls and grammars of a batch's rows, for a verify forward: what slot j of a row's draft
    follows is its output and the draft's path to slot j, so each slot's logits are masked and
    controlled as plain decoding's would be had it emitted that path."""

    requests: Sequence[RowRequest]
    outputs: Sequence[list[int]]  # per row: generated so far, the pending token last
    params: GenerationParams
    matchers: Sequence[Matcher | None]  # per row: where it stands in its grammar; None: no format

    @staticmethod
    def of(batch: Batch) -> DraftControls | None:
        """The controls and grammars of the batch's active rows, or None when no row has either."""
        requests, matchers = [row.request for row in batch.active], [row.matcher for row in batch.active]
        if all(r.controls is None for r in requests) and all(m is None for m in matchers):
            return None
        return DraftControls(requests, [row.tokens for row in batch.active], batch.params, matchers)

    def apply(self, logits: torch.Tensor, drafts: Sequence[Draft]) -> torch.Tensor:
        """[B, W, V] a verify forward's logits under each row's grammar and controls, slot by slot (padding
        as it is), in plain steps' order (`strategies.runtime.batch.ruled_logits`): sampling, the grammar's
        mask first; greedy, the controls first, then the slots acceptance reaches masked where their argmax
        is refused (`strategies.constraints.drafts.reached_masks`). `drafts` are cut to what the grammars
        allow (`strategies.constraints.drafts.prune`)."""
        greedy = self.params.sampling.greedy
        if not greedy:
            logits = draft_logits(logits, self.matchers, drafts)
        if any(r.controls is not None for r in self.requests):
            b, w, v = logits.shape
            rows = [
                RowSlots(request.controls, request.prompt, output, r * w, slot_paths(draft))
                for r, (request, output, draft) in enumerate(zip(self.requests, self.outputs, drafts, strict=True))
                if request.controls is not None
            ]
            ends, temperature = min_tokens_ends(self.params), self.params.sampling.temperature
            logits = control_logits(logits.reshape(b * w, v), rows, ends, temperature).view(b, w, v)
        return draft_logits(logits, self.matchers, drafts, greedy=True) if greedy else logits

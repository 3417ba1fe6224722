"""The proposer contract: drafts below each row's pending token, told afterwards what was emitted.

A proposer never touches the target model or its cache. The speculative loop asks it for one
`Draft` per row, verifies all rows in one target forward (`strategies.verification.verify`), and reports each
row's emitted tokens (accepted draft tokens, then the target's token, which becomes the next
pending token). A proposer that raises, or returns a draft that fails `drafts.draft_problem`,
costs that step its speed-up, never a row: the rows concerned take one ordinary autoregressive step.

A proposer that drafts from the target's own states (draft heads) says so (`wants_states`) and
receives, at its start and after every step, what the target computed for each row in the
forward just taken: prefill, verify and plain steps alike (`TargetStates`). Proposers that do not
ask never pay for them.

The one exception to "never touches the target's cache": a proposer that drafts with the target's
own first layers (`self_speculative`) sets `shares_cache = True` and is handed the batch's cache
(`use_cache(kv)`) before `start`. It only adds provisional columns (`kv_cache.Provisional`), which
the next target forward reuses or drops, so the cache's slots stay the loop's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from strategies.base import GenerationParams
from strategies.verification.drafts import Draft


@dataclass
class TargetStates:
    """The target's last hidden states (after its final norm: what its LM head reads) from the
    forward(s) just taken, at the positions that stay in each row's context."""

    hidden: torch.Tensor  # [B, n, H] every position the forward(s) computed, kept or not
    kept: list[list[int]]  # per row: indices into n of its kept positions, in order (never empty)
    # [B, n, V] the target's logits at every slot of a verify forward, kept or not (a Jacobi
    # iteration's next guess); None after a prefill or plain steps, whose tokens are the emitted ones.
    logits: torch.Tensor | None = None

    def last(self) -> torch.Tensor:
        """[B, H]: per row, the state that chose its pending token (the last kept position)."""
        index = torch.tensor([k[-1] for k in self.kept], device=self.hidden.device)
        return self.hidden[torch.arange(len(self.kept), device=self.hidden.device), index]

    def join(self, other: TargetStates) -> TargetStates:
        """These rows, then `other`'s (rows joining a batch): positions padded to the longer run. The
        verify logits are not kept: the proposers have read them by the time rows join."""
        width = max(self.hidden.shape[1], other.hidden.shape[1])

        def padded(hidden: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(hidden, (0, 0, 0, width - hidden.shape[1]))

        return TargetStates(torch.cat([padded(self.hidden), padded(other.hidden)]), self.kept + other.kept)

    def rows(self, rows: list[int]) -> TargetStates:
        """Only batch rows `rows` (in order)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.hidden.device)
        logits = self.logits[index] if self.logits is not None else None
        return TargetStates(self.hidden[index], [self.kept[r] for r in rows], logits)


@dataclass
class ProposalContext:
    num_generated: list[int]  # per row: how many tokens it has generated so far, the pending one included
    budgets: list[int]  # per row: deepest useful draft path (0: no draft for this row)
    max_nodes: int  # most draft nodes per row (trees)


class Proposer(Protocol):
    name: str
    wants_states: bool  # True: `start` and `emitted` receive the target's states, else None

    def start(
        self, contexts: list[list[int]], keys: torch.Tensor, params: GenerationParams, states: TargetStates | None
    ) -> None:
        """The first step of a batch that uses this proposer (not always the batch's first step: a
        controller may start it later): per active row its prompt and generated tokens, the last
        being the pending token (not yet in the target's cache); `keys` [B] are the rows' sampling
        keys; `states` those of the target's latest forward (its last kept position chose the
        pending token)."""

    def add_rows(self, contexts: list[list[int]], keys: torch.Tensor, states: TargetStates | None) -> None:
        """Rows joining the batch after its start (continuous batching), after the rows there are, as
        `start` gives them: their contexts, sampling keys [B'] and the states of their prefill."""

    def propose(self, context: ProposalContext) -> list[Draft]:
        """One draft per row below its pending token. Not called on steps that do not speculate."""

    def emitted(self, emitted: list[list[int]], states: TargetStates | None) -> None:
        """Per row, the tokens emitted this step (every step, drafted or not); the last one is the
        row's new pending token. `states`: the target's states at the positions the step(s) fed and
        kept (the previous pending token, then the accepted draft tokens), one run of plain steps
        at once; the last kept position chose the new pending token."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows (batch indices, in order) stay in the batch; the others finished (maybe all)."""

    def stats(self) -> dict[str, float]:
        """Proposer-specific numbers for the batch's throughput record (e.g. the trie's size)."""

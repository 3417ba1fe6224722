"""What the target computed for each row in the forward just taken (its hidden states, and a verify
forward's logits), for the drafters that read them: the batch keeps it, the loop hands it over."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TargetStates:
    """The target's last hidden states (after its final norm: what its LM head reads) from the
    forward(s) just taken, at the positions that stay in each row's context."""

    # [B, n, H] every position the forward(s) computed, kept or not; None when no proposer wants them.
    hidden: torch.Tensor | None
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

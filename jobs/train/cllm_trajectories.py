"""The data of `train cllm`: the target's Jacobi trajectories, one block of tokens after another from a
guess to its fixed point, and the statistics of decoding they show (the CLLM paper's): Jacobi iterations
per block, fast-forwarded tokens (fixed in an iteration beyond the one each iteration is sure to fix)
and stationary tokens (already right and kept through an iteration while a wrong token stood before
them), per block."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Trajectories:
    """Jacobi trajectories of a set of prompts, as flat tensors (what the checkpoint file holds).

    Block e of `blocks` is block `k` of prompt row `row`: its context is `sequences[row, :P + k*n]`
    and its states are `states[first : first + count]`, the initial guess first, the fixed point last.
    """

    sequences: torch.Tensor  # [N, P + K*n] int64: each prompt, then the fixed point of each of its K blocks
    states: torch.Tensor  # [S, n] int64: every kept block's states in order
    blocks: torch.Tensor  # [E, 4] int64: (row, k, first, count) of each kept block
    prompt_tokens: int
    # [N, P + K*n] int64: each prompt's corpus window, the prompt then the text that followed it in the
    # corpus (what `loss.ar_labels=corpus` learns); None where no loss reads it (held-out prompts).
    corpus: torch.Tensor | None = None

    @property
    def block_size(self) -> int:
        return self.states.shape[1]


def stacked(
    sequences: list[torch.Tensor], states: list[torch.Tensor], kept: list[tuple[int, ...]], prompt_tokens: int
) -> Trajectories:
    """Trajectories of rows collected in batches: their `sequences` and `states` in order, and `kept`, the
    (row, k, first, count) of each block kept."""
    return Trajectories(torch.cat(sequences), torch.cat(states), torch.tensor(kept).view(-1, 4), prompt_tokens)


def block_statistics(states: torch.Tensor) -> tuple[int, int, int]:
    """(iterations, fast-forwarded tokens, stationary tokens) of one block's states [J+1, n], fixed point last.

    Iteration j (state j-1 -> j) fixes as many tokens as the converged prefix grows, always >= 1; what
    it fixes beyond one token is fast-forwarded. A token is stationary when some iteration keeps it right while a wrong
    token precedes it: it was right before the tokens it depends on were.
    """
    right = states == states[-1]  # [J+1, n]
    prefix = right.int().cumprod(dim=1).sum(dim=1)  # [J+1] converged prefix length of each state
    fast_forwarded = int((prefix[1:] - prefix[:-1] - 1).clamp(min=0).sum())
    behind_wrong = torch.arange(states.shape[1])[None, :] > prefix[:-1, None]  # [J, n]
    stationary = int((right[:-1] & right[1:] & behind_wrong).any(dim=0).sum())
    return len(states) - 1, fast_forwarded, stationary


def trajectory_statistics(data: Trajectories) -> dict[str, float]:
    """Per-block means of `block_statistics` over every block of `data`, and fixed tokens per iteration."""
    numbers = torch.tensor(
        [block_statistics(data.states[first : first + count]) for _, _, first, count in data.blocks.tolist()],
        dtype=torch.float64,
    ).view(-1, 3)  # [E, 3]
    iterations, fast_forwarded, stationary = numbers.mean(dim=0).tolist()
    return {
        "blocks": len(numbers),
        "iterations_per_block": round(iterations, 3),
        "tokens_per_iteration": round(data.block_size / iterations, 3),
        "fast_forwarded_per_block": round(fast_forwarded, 3),
        "stationary_per_block": round(stationary, 3),
    }

"""Training batches chosen as a pure function of (seed, step): windows of the packed token stream
(`lm`, `draft`, `exits`), or whole sequences in a shuffled order (`heads`, `eagle`, and the blocks of `cllm`).

Because a step's batch depends on nothing but the seed and the step number, a resumed run sees
exactly the batches an uninterrupted run would, with no sampler state to checkpoint.

Windows are trained in two phases: short windows first (more tokens per second, since attention cost
grows with length), then windows of the full context for the last steps, so that the model has
seen every position it advertises. Tokens per step stay constant across the switch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from jobs.train.config import TrainConfig
from pipeline.errors import JobError


@dataclass(frozen=True)
class Phase:
    seq_len: int  # tokens per window (predictions per window)
    batch_size: int  # windows per step
    first_step: int  # global step where this phase starts


def phase_of(step: int, config: TrainConfig) -> Phase:
    """The phase that global `step` (0-based) belongs to."""
    final_steps = round(config.steps * config.final_fraction)
    first_final = config.steps - final_steps
    if step < first_final:
        return Phase(config.seq_len, config.batch_size, 0)
    return Phase(config.final_seq_len, config.batch_size * config.seq_len // config.final_seq_len, first_final)


class WindowSampler:
    """Batches of windows [B, T+1] from one token stream; each epoch is a fresh shuffled tiling.

    Epoch e of windows of length T tiles the stream from a random shift in [0, T) with
    non-overlapping windows of T+1 tokens (stride T) and visits them in a random order; both are
    drawn from a generator keyed by (seed, T, e).
    """

    def __init__(self, tokens: torch.Tensor, seed: int) -> None:
        self.tokens = tokens  # [N] int32
        self.seed = seed
        self._tilings: dict[tuple[int, int], np.ndarray] = {}  # a few epochs per run: never evicted

    def batch(self, step: int, config: TrainConfig) -> torch.Tensor:
        """The windows of global `step`: [B, T+1] int64 (inputs are [:, :-1], next tokens [:, 1:])."""
        phase = phase_of(step, config)
        starts = []
        for b in range(phase.batch_size):
            index = (step - phase.first_step) * phase.batch_size + b
            order = self._epoch_starts(phase.seq_len, index)
            starts.append(order[index % len(order)])
        rows = [self.tokens[s : s + phase.seq_len + 1] for s in starts]
        return torch.stack(rows).long()

    def _epoch_starts(self, seq_len: int, index: int) -> np.ndarray:
        windows = (len(self.tokens) - seq_len) // seq_len  # windows per epoch, before the shift
        if windows < 1:
            raise JobError(
                f"the corpus holds {len(self.tokens)} tokens, too few for one window of {seq_len + 1}; "
                "use a larger corpus or shorter train.seq_len / train.final_seq_len"
            )
        key = (seq_len, index // windows)  # (window length, epoch)
        if key not in self._tilings:
            rng = np.random.default_rng([self.seed, *key])
            shift = int(rng.integers(seq_len))
            self._tilings[key] = shift + seq_len * rng.permutation(windows)  # [windows] start offsets
        return self._tilings[key]


class SequenceSampler:
    """Batches of sequence indices [B]: each epoch a fresh permutation keyed by (seed, epoch)."""

    def __init__(self, count: int, seed: int) -> None:
        self.count = count
        self.seed = seed
        self._orders: dict[int, np.ndarray] = {}

    def batch(self, step: int, config: TrainConfig) -> torch.Tensor:
        """Indices of the sequences of global `step`: [B] int64."""
        indices = range(step * config.batch_size, (step + 1) * config.batch_size)
        return torch.tensor([self.pick(index) for index in indices], dtype=torch.long)

    def pick(self, index: int) -> int:
        """The sequence of global example `index` (step * batch_size + row)."""
        epoch = index // self.count
        if epoch not in self._orders:
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.count)
        return int(self._orders[epoch][index % self.count])

"""The training step of `train cllm`, the CLLM paper's `cllm_trainer_global.py`: per example one random
non-final state y of a block with fixed point y*, L = L_GC + ar_weight · L_AR.

L_GC is the soft cross-entropy of the model's distributions on [context ; y] against its own, detached,
distributions on [context ; y*], over the block positions from the first one where y differs from y*
(the converged prefix has identical inputs in both, nothing to learn). L_AR is the label-smoothed
cross-entropy of the fixed-point tokens on [context ; y*]: it keeps the model's greedy output where it
was, which L_GC alone would let drift toward degenerate repeats (any repeat is an easy fixed point).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from jobs.train.cllm_trajectories import Trajectories
from jobs.train.config import TrainConfig
from jobs.train.config_fine_tune import CLLMLossConfig
from jobs.train.loop import Objective
from jobs.train.samplers import SequenceSampler
from pipeline.errors import JobError


class StateSampler:
    """Batches of (block, state) pairs [B, 2]: blocks with a non-final state, one random non-final state each.

    Blocks go in a fresh permutation per epoch keyed by (seed, epoch), states are keyed by (seed,
    example index): a pure function of (seed, step), so a resumed run sees the batches an
    uninterrupted one would.
    """

    def __init__(self, counts: torch.Tensor, seed: int) -> None:
        self.blocks = torch.nonzero(counts > 1).flatten()  # [E'] blocks with a non-final state
        if not len(self.blocks):
            raise JobError("every collected block was a fixed point from its initial guess: nothing to train on")
        self.counts = counts
        self.seed = seed
        self._order = SequenceSampler(len(self.blocks), seed)

    def batch(self, step: int, config: TrainConfig) -> torch.Tensor:
        """The picks of global `step`: [B, 2] int64, (index into Trajectories.blocks, state index)."""
        picks = []
        for index in range(step * config.batch_size, (step + 1) * config.batch_size):
            block = int(self.blocks[self._order.pick(index)])
            non_final = int(self.counts[block]) - 1
            picks.append((block, int(np.random.default_rng([self.seed, 1, index]).integers(non_final))))
        return torch.tensor(picks, dtype=torch.long)


def block_logits(
    model: torch.nn.Module, data: Trajectories, picks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's logits at each block position on the picked states and on their fixed points.

    `picks` [B, 2] (block, state). Returns logits on [context ; state] [B, n, V], on [context ; fixed
    point] [B, n, V] (float32), the states [B, n] and the fixed points [B, n]. One forward over rows
    [context ; state ; fixed point]: the fixed point sits at the state's positions and does not see
    the state, so the context, the longest part, is computed once for both.
    """
    picks = picks.cpu()
    block = data.blocks[picks[:, 0]]  # [B, 4] (row, k, first, count)
    state = data.states[block[:, 2] + picks[:, 1]]  # [B, n]
    fixed = data.states[block[:, 2] + block[:, 3] - 1]  # [B, n]
    lengths = data.prompt_tokens + block[:, 1] * data.block_size  # [B] context lengths
    inputs, positions, allowed, slots = _packed_rows(data, block[:, 0], lengths, state, fixed)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)  # [B, T, T]
    hidden = model.get_decoder()(
        input_ids=inputs.to(device), position_ids=positions.to(device), attention_mask=mask[:, None].to(device)
    ).last_hidden_state  # [B, T, H]
    index = slots.to(device)[..., None].expand(-1, -1, hidden.shape[-1])  # [B, 2n, H]
    logits = model.get_output_embeddings()(hidden.gather(1, index)).float()  # [B, 2n, V]
    on_state, on_fixed = logits.split(data.block_size, dim=1)  # [B, n, V] each
    return on_state, on_fixed, state.to(device), fixed.to(device)


def corpus_logits(model: torch.nn.Module, data: Trajectories, picks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits [B, n, V] (float32) at the picked blocks' positions of their corpus windows,
    on the corpus' own context, and the corpus tokens there [B, n]: what the paper's `use_gt_labels`
    trains L_AR on, the corpus text instead of the target's greedy tokens.

    `picks` [B, 2] (block, state). Rows `corpus[row, :P + (k+1)*n]`, right-padded: causal attention
    keeps every real token blind to the padding after it.
    """
    if data.corpus is None:
        raise JobError("loss.ar_labels=corpus needs the corpus windows of the trajectories; these have none")
    block = data.blocks[picks.cpu()[:, 0]]  # [B, 4] (row, k, first, count)
    n = data.block_size
    ends = data.prompt_tokens + (block[:, 1] + 1) * n  # [B] each row's window up to its block's end
    inputs = torch.zeros(len(block), int(ends.max()), dtype=torch.long)  # [B, T]
    for b, (row, end) in enumerate(zip(block[:, 0].tolist(), ends.tolist(), strict=True)):
        inputs[b, :end] = data.corpus[row, :end]
    slots = ends[:, None] - n - 1 + torch.arange(n)  # [B, n] the outputs that predict the block's tokens
    device = next(model.parameters()).device
    hidden = model.get_decoder()(input_ids=inputs.to(device)).last_hidden_state  # [B, T, H]
    index = slots.to(device)[..., None].expand(-1, -1, hidden.shape[-1])  # [B, n, H]
    logits = model.get_output_embeddings()(hidden.gather(1, index)).float()  # [B, n, V]
    return logits, inputs.gather(1, slots + 1).to(device)


def cllm_losses(
    model: torch.nn.Module, data: Trajectories, picks: torch.Tensor, label_smoothing: float, ar_labels: str = "target"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_GC, L_AR) of the picked states `picks` [B, 2] (block, state); L_AR on the fixed points
    (`ar_labels` "target") or on the corpus text at the same positions ("corpus", `corpus_logits`)."""
    on_state, on_fixed, state, fixed = block_logits(model, data, picks)  # [B, n, V] x 2, [B, n] x 2
    diverged = (state != fixed).int().cumsum(dim=1).bool()  # [B, n] from the first wrong position on
    consistency = F.cross_entropy(on_state[diverged], on_fixed[diverged].detach().softmax(dim=-1))
    logits, labels = (on_fixed, fixed) if ar_labels == "target" else corpus_logits(model, data, picks)
    autoregressive = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=label_smoothing)
    return consistency, autoregressive


def cllm_objective(data: Trajectories, loss: CLLMLossConfig) -> Objective:
    """The training objective L_GC + ar_weight · L_AR over a batch of picks from `StateSampler`."""

    def objective(model: torch.nn.Module, picks: torch.Tensor) -> torch.Tensor:
        consistency, autoregressive = cllm_losses(model, data, picks, loss.label_smoothing, loss.ar_labels)
        return consistency + loss.ar_weight * autoregressive

    return objective


def _packed_rows(
    data: Trajectories, rows: torch.Tensor, lengths: torch.Tensor, state: torch.Tensor, fixed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [context ; state ; fixed point] for contexts `sequences[rows, :lengths]` ([B] each), blocks [B, n].

    Returns the inputs [B, T], their positions [B, T] (the fixed point at the state's), which token
    each token attends to [B, T, T] (causal, the fixed point blind to the state) and the positions
    whose outputs predict the state's then the fixed point's tokens [B, 2n]. Right-padded: no real
    token attends to the padding after it.
    """
    n = data.block_size
    width = int(lengths.max()) + 2 * n
    inputs = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T]
    positions = torch.arange(width).repeat(len(rows), 1)  # [B, T]
    allowed = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(rows), 1, 1)  # [B, T, T]
    for b, (row, length) in enumerate(zip(rows.tolist(), lengths.tolist(), strict=True)):
        inputs[b, :length] = data.sequences[row, :length]
        inputs[b, length : length + n] = state[b]
        inputs[b, length + n : length + 2 * n] = fixed[b]
        positions[b, length + n : length + 2 * n] -= n
        allowed[b, length + n : length + 2 * n, length : length + n] = False
    block = torch.arange(n)  # [n]: slot i reads the token before block position i (the context's last for i = 0)
    on_state = lengths[:, None] - 1 + block  # [B, n]
    on_fixed = torch.where(block == 0, lengths[:, None] - 1, lengths[:, None] + n - 1 + block)  # [B, n]
    return inputs, positions, allowed, torch.cat([on_state, on_fixed], dim=1)

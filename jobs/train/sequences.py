"""The target's own outputs as training data: prompt windows of the corpus, the target's greedy
continuations of them, cached in a checkpoint directory so that a resumed run does not decode again.

Heads and the CMLM learn to predict this target's tokens (sequence-level distillation), not the raw
corpus: these are the sequences they train on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from jobs.train import checkpoint
from pipeline.errors import JobError
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams


def draw_prompts(tokens: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """`count` windows of `length` tokens at random offsets of the stream `tokens` [N]: [count, length] int64."""
    if len(tokens) < length:
        raise JobError(f"the corpus split holds {len(tokens)} tokens, fewer than one prompt of {length}")
    starts = np.random.default_rng(seed).integers(0, len(tokens) - length + 1, size=count)
    return torch.stack([tokens[s : s + length] for s in starts.tolist()]).long()


def continue_greedily(
    target: torch.nn.Module, prompts: torch.Tensor, new_tokens: int, batch_size: int, desc: str
) -> torch.Tensor:
    """Each prompt of `prompts` [N, P] followed by the target's `new_tokens` greedy tokens: [N, P+C] int32.

    EOS does not end a row: every sequence has the same length, so no position is padding.
    """
    strategy = AutoregressiveStrategy(ModelRunner(target))
    params = GenerationParams(new_tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    rows = []
    with tqdm(total=len(prompts), desc=desc, unit="seq", dynamic_ncols=True, mininterval=1.0) as bar:
        for chunk in prompts.split(batch_size):
            requests = [RowRequest(prompt=p, key=0) for p in chunk.tolist()]
            rows += [r.tokens for r in strategy.generate(requests, params).rows]
            bar.update(len(chunk))
    return torch.cat([prompts, torch.tensor(rows, dtype=torch.long)], dim=1).int()


def cached_sequences(
    directory: Path, fingerprint: dict[str, Any], generate: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor, float]:
    """The sequences saved in `directory` by a run of the same config, else `generate()`'s, saved atomically.

    Returns the sequences [N, L] and the seconds their generation took (in whichever run made them).
    """
    state = checkpoint.load_checkpoint(directory, fingerprint)
    if state is not None:
        print(f"reusing the {len(state['sequences'])} generated sequences in {directory}")
        return state["sequences"], state["wall_s"]
    start = time.perf_counter()
    sequences = generate()  # [N, L]
    wall_s = round(time.perf_counter() - start, 1)
    checkpoint.save_checkpoint(directory, {"sequences": sequences, "wall_s": wall_s, "fingerprint": fingerprint})
    return sequences, wall_s


def data_fingerprint(fingerprint: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keys of a job's fingerprint that determine its collected data (the target, corpus, data
    settings and seed; not the model trained, its loss, steps or evaluation), less `ignore`.

    A run changed only in how it trains then reuses the data of an earlier one.
    """
    return {
        key: value
        for key, value in fingerprint.items()
        if (key.startswith(("target", "corpus.", "data.")) or key == "train.seed") and key not in ignore
    }

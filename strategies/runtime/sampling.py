"""Turning logits into tokens: greedy choice, filtered probabilities, and keyed random draws.

Random draws come from a counter-based hash of (seed, row key, position, stream) instead of a
stateful generator, so a row's sample depends only on its own identity and position — never on
which rows share its batch, how many steps a strategy took, or which actor ran it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

# Streams of keyed uniforms: which draw at a position each serves. The target's own draw is 0 in
# every strategy, so a row's sample does not depend on how it was decoded.
STREAM_TARGET = 0  # the target's token at a position (autoregressive, walks, bonus tokens)
STREAM_ACCEPT = 1  # speculative sampling's acceptance test of a draft token
STREAM_RESIDUAL = 2  # the draw from the residual max(0, p - q) after a rejection
STREAM_DRAFT = 3  # the draft model's own sample

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit constant as the signed int64 torch stores."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors; multiplication wraps modulo 2**64."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    return x ^ _shr(x, 31)


def row_key(row_id: str, sample_index: int = 0) -> int:
    """A stable signed 64-bit key for sample `sample_index` of a row (same on every machine and Python
    run). Each sample has its own key, so a sample depends neither on how many are drawn nor on
    which share its batch; sample 0's is the row's key (BLAKE2's salt defaults to zeros), so one sample
    per row draws what it always drew."""
    salt = sample_index.to_bytes(16, "little")
    digest = hashlib.blake2b(row_id.encode("utf-8"), digest_size=8, salt=salt).digest()
    return int.from_bytes(digest, "little", signed=True)


def seeded_key(key: int, seed: int, batch_seed: int) -> int:
    """The key whose draws under `batch_seed` are `key`'s under `seed`. `keyed_uniform` mixes seed and
    key only as `seed ^ key`, so a row with a seed of its own shares a batch (and its one seed)
    exactly: its samples are those of a job run with its seed."""
    return key ^ seed ^ batch_seed


def keyed_uniform(seed: int, keys: torch.Tensor, positions: torch.Tensor, stream: int = STREAM_TARGET) -> torch.Tensor:
    """Uniform floats in [0, 1), float64, one per (key, position): `keys` and `positions` [B] int64.

    `stream` separates independent uses at the same position (the `STREAM_*` constants above).
    """
    x = _splitmix64(torch.full_like(keys, seed) ^ keys)
    x = _splitmix64(x ^ (positions * 8 + stream))
    return _shr(x, 11).double() / float(1 << 53)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p: `logits` [..., V] -> [..., V] float32+."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = logits.to(dtype) / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = scores.topk(params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = scores.softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the mass before it already reaches top_p; the first token always stays.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: `probs` [B, V], `uniforms` [B] in [0, 1) -> token ids [B]."""
    cdf = probs.cumsum(dim=-1)  # [B, V]
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tokens.clamp(max=probs.shape[-1] - 1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension: [..., V] -> [...]. Taken as `torch.max`'s indices, which
    break ties on the first maximum as `argmax` does (and pick a NaN as it does): on CPU `argmax`
    over a vocabulary is the slower of the two, and this runs on every plain step and at every slot
    acceptance reads."""
    return logits.max(dim=-1).indices


def choose_tokens(
    logits: torch.Tensor, params: SamplingParams, keys: torch.Tensor, positions: torch.Tensor | None
) -> torch.Tensor:
    """Next token per row: `logits` [B, V]; `keys`, `positions` [B] identify each draw (greedy: unused)."""
    if params.greedy:
        return greedy_tokens(logits)
    probs = filtered_probs(logits, params)
    return sample_from(probs, keyed_uniform(params.seed, keys, positions.to(keys.device)).to(probs.device))

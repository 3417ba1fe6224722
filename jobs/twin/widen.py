"""Widening a Llama layer's weights so that the wider layer computes the narrow one's function.

A twin's hidden state is the source's, zero-padded: h' = [h, 0]. Every matrix is the source's,
placed in a larger zero matrix at the rows and columns that read and write the real dimensions, so
the padding stays zero through every layer. Three things need more than padding:

- RMSNorm divides by the root mean square over all H' dimensions, of which only H are non-zero:
  mean' = (H/H') mean. With eps' = eps · H/H' the denominator is sqrt(H/H') times the source's, and
  norm weights scaled by sqrt(H/H') undo it exactly.
- Attention heads: each of the source's query heads goes to a twin query head whose key/value head
  holds a copy of the source's key/value head it reads (`HeadLayout`); the twin's other heads have
  zero weights, so they attend uniformly over zero values and add nothing.
- A wider head dimension (d' = s · d): rotary embedding rotates dimension pairs (i, i + d/2) at
  frequency θ^(-2i/d); the twin's pair (s·i, s·i + d'/2) turns at θ^(-2si/d') = θ^(-2i/d), the same,
  so source dimension i goes to twin dimension s·i (and i + d/2 to s·i + d'/2). Scores are scaled by
  1/sqrt(d') instead of 1/sqrt(d): queries are multiplied by sqrt(d'/d) to keep them.

Extra layers (a deeper twin) are full layers of random weights whose two output projections (attention
and MLP) are zero: they cost what a layer costs and add nothing to the residual stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerShape:
    """The shape of one Llama decoder layer (and the hidden state around it)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int


@dataclass(frozen=True)
class HeadLayout:
    """Where the source's attention heads sit in the twin.

    `query_heads[j]`: the twin query head of source query head j. `kv_sources[t]`: the source key/value
    head whose weights twin key/value head t holds, or -1 (zero weights). `dims[i]`: the twin head
    dimension of source head dimension i."""

    query_heads: tuple[int, ...]
    kv_sources: tuple[int, ...]
    dims: tuple[int, ...]


def head_layout(source: LayerShape, twin: LayerShape) -> HeadLayout:
    """Each source key/value head fills as many twin key/value groups as its query heads need (one where
    the twin's groups are as large; several where the twin has smaller groups, e.g. full multi-head
    attention), each group with a copy of its key/value weights."""
    group, twin_group = _group(source), _group(twin)
    query_heads: list[int] = []
    kv_sources = [-1] * twin.num_key_value_heads
    next_group = 0
    for kv in range(source.num_key_value_heads):
        for member in range(group):
            if member % twin_group == 0:
                if next_group >= twin.num_key_value_heads:
                    raise ValueError(_layout_problem(source, twin))
                kv_sources[next_group] = kv
                next_group += 1
            query_heads.append((next_group - 1) * twin_group + member % twin_group)
    return HeadLayout(tuple(query_heads), tuple(kv_sources), _head_dims(source.head_dim, twin.head_dim))


def layout_problem(source: LayerShape, twin: LayerShape) -> str | None:
    """Why a twin of this shape cannot compute the source's function, or None."""
    if twin.hidden_size < source.hidden_size or twin.intermediate_size < source.intermediate_size:
        return (
            f"hidden_size {twin.hidden_size} and intermediate_size {twin.intermediate_size} must be at least "
            f"the source's {source.hidden_size} and {source.intermediate_size}"
        )
    if twin.head_dim % source.head_dim:
        return f"head_dim {twin.head_dim} must be a multiple of the source's {source.head_dim}"
    if twin.num_attention_heads % twin.num_key_value_heads:
        return f"num_attention_heads {twin.num_attention_heads} must be a multiple of num_key_value_heads"
    groups_per_kv = -(-_group(source) // _group(twin))
    if source.num_key_value_heads * groups_per_kv > twin.num_key_value_heads:
        return _layout_problem(source, twin)
    return None


def _layout_problem(source: LayerShape, twin: LayerShape) -> str:
    return (
        f"{twin.num_attention_heads} query heads in {twin.num_key_value_heads} key/value groups cannot hold the "
        f"source's {source.num_attention_heads} query heads in {source.num_key_value_heads} groups: raise "
        "num_key_value_heads or num_attention_heads"
    )


def _group(shape: LayerShape) -> int:
    return shape.num_attention_heads // shape.num_key_value_heads


def _head_dims(source_dim: int, twin_dim: int) -> tuple[int, ...]:
    stride, half = twin_dim // source_dim, source_dim // 2
    return tuple(stride * i if i < half else twin_dim // 2 + stride * (i - half) for i in range(source_dim))


def place(weight: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A zero matrix of `shape` holding `weight` [r, c] at rows `rows` [r] and columns `cols` [c]."""
    out = weight.new_zeros(shape)
    out[rows.to(out.device)[:, None], cols.to(out.device)[None, :]] = weight
    return out


def pad(vector: torch.Tensor, size: int) -> torch.Tensor:
    """`vector` [n] followed by zeros to `size`."""
    return torch.cat([vector, vector.new_zeros(size - vector.shape[0])])


def pad_columns(matrix: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, H] -> [rows, width], each row zero-padded: embeddings and LM heads over the hidden state."""
    out = matrix.new_zeros(matrix.shape[0], width)
    out[:, : matrix.shape[1]] = matrix
    return out


def norm_weight(weight: torch.Tensor, twin_hidden: int) -> torch.Tensor:
    """An RMSNorm weight [H] for the twin's H' dimensions under eps' = eps · H/H' (`twin_eps`)."""
    return pad(weight * math.sqrt(weight.shape[0] / twin_hidden), twin_hidden)


def twin_eps(eps: float, source_hidden: int, twin_hidden: int) -> float:
    """The twin's RMSNorm epsilon: the root mean square of the padded state times sqrt(H'/H) keeps it."""
    return eps * source_hidden / twin_hidden


def _head_rows(heads: list[int], layout_dims: tuple[int, ...], head_dim: int) -> torch.Tensor:
    dims = torch.tensor(layout_dims)
    return torch.cat([head * head_dim + dims for head in heads])


def attention_weights(
    weights: dict[str, torch.Tensor], source: LayerShape, twin: LayerShape
) -> dict[str, torch.Tensor]:
    """q/k/v/o projections ([out, in], as `torch.nn.Linear` holds them) of one layer, widened."""
    layout = head_layout(source, twin)
    hidden = torch.arange(source.hidden_size)
    d, d_twin = source.head_dim, twin.head_dim
    q_rows = _head_rows(list(layout.query_heads), layout.dims, d_twin)
    q_scale = math.sqrt(d_twin / d)
    kv_twin = [t for t, s in enumerate(layout.kv_sources) if s >= 0]
    kv_rows = _head_rows(kv_twin, layout.dims, d_twin)
    kv_source_rows = torch.cat([torch.arange(s * d, (s + 1) * d) for s in layout.kv_sources if s >= 0])
    kv_source_rows = kv_source_rows.to(weights["k_proj"].device)
    q_out, kv_out = twin.num_attention_heads * d_twin, twin.num_key_value_heads * d_twin
    return {
        "q_proj": place(weights["q_proj"] * q_scale, q_rows, hidden, (q_out, twin.hidden_size)),
        "k_proj": place(weights["k_proj"][kv_source_rows], kv_rows, hidden, (kv_out, twin.hidden_size)),
        "v_proj": place(weights["v_proj"][kv_source_rows], kv_rows, hidden, (kv_out, twin.hidden_size)),
        "o_proj": place(weights["o_proj"], hidden, q_rows, (twin.hidden_size, q_out)),
    }


def mlp_weights(weights: dict[str, torch.Tensor], source: LayerShape, twin: LayerShape) -> dict[str, torch.Tensor]:
    """gate/up/down projections of one layer, widened: the extra MLP units have zero weights."""
    hidden, inner = torch.arange(source.hidden_size), torch.arange(source.intermediate_size)
    wide = (twin.intermediate_size, twin.hidden_size)
    return {
        "gate_proj": place(weights["gate_proj"], inner, hidden, wide),
        "up_proj": place(weights["up_proj"], inner, hidden, wide),
        "down_proj": place(weights["down_proj"], hidden, inner, (twin.hidden_size, twin.intermediate_size)),
    }


def filler_layer(twin: LayerShape, generator: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A layer that costs a layer and adds nothing: random inputs-side weights (std 0.02), zero outputs,
    made on the generator's device: a 7B twin's filler layers are most of its weights, drawn on the GPU
    that decodes with them instead of on the CPU and copied over. Drawn in float32 whatever `dtype`, so
    a seed gives the same layers in every dtype on one device (CPU and CUDA generators draw apart)."""
    q_out, kv_out = twin.num_attention_heads * twin.head_dim, twin.num_key_value_heads * twin.head_dim
    device = generator.device

    def random(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator, device=device) * 0.02).to(dtype)

    return {
        "q_proj": random(q_out, twin.hidden_size),
        "k_proj": random(kv_out, twin.hidden_size),
        "v_proj": random(kv_out, twin.hidden_size),
        "o_proj": torch.zeros(twin.hidden_size, q_out, dtype=dtype, device=device),
        "gate_proj": random(twin.intermediate_size, twin.hidden_size),
        "up_proj": random(twin.intermediate_size, twin.hidden_size),
        "down_proj": torch.zeros(twin.hidden_size, twin.intermediate_size, dtype=dtype, device=device),
    }

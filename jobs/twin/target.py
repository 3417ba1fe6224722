"""The twin target's config and weights, computed from the shipped target's.

The weights come one tensor at a time under their transformers names (`twin_tensors`), so a twin of
several GB is written shard by shard without ever holding all of it, or made on a GPU and handed to a
model there (`in_memory`). The source's layers come first, then the filler layers (`widen.filler_layer`): a job's
exits and self-speculation read the first layers, which are the source's own.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig

from jobs.twin.widen import LayerShape, attention_weights, filler_layer, mlp_weights, norm_weight, pad_columns, twin_eps

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def layer_shape(config: PretrainedConfig) -> LayerShape:
    """The layer shape a Llama-family config describes."""
    heads = config.num_attention_heads
    return LayerShape(
        hidden_size=config.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate_size=config.intermediate_size,
    )


def twin_config(source: PretrainedConfig, shape: LayerShape, num_layers: int) -> PretrainedConfig:
    """The source's config at the twin's shape, with the RMSNorm epsilon that keeps its function."""
    config = copy.deepcopy(source)
    config.hidden_size = shape.hidden_size
    config.num_attention_heads = shape.num_attention_heads
    config.num_key_value_heads = shape.num_key_value_heads
    config.head_dim = shape.head_dim
    config.intermediate_size = shape.intermediate_size
    config.num_hidden_layers = num_layers
    config.rms_norm_eps = twin_eps(source.rms_norm_eps, source.hidden_size, shape.hidden_size)
    return config


def source_weights(source_dir: Path) -> dict[str, torch.Tensor]:
    """The source's state dict (transformers' names), from all its weights files."""
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(source_dir.glob("*.safetensors")):
        weights |= load_file(str(path))
    return weights


def twin_tensors(
    weights: dict[str, torch.Tensor],  # the source's state dict, transformers' names
    source: PretrainedConfig,
    shape: LayerShape,
    num_layers: int,
    dtype: torch.dtype,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight of the twin on `device`, widened there in float64 and stored in
    `dtype`; the filler layers drawn there from `seed` (`widen.filler_layer`)."""
    narrow = layer_shape(source)
    hidden = shape.hidden_size

    def widened(name: str) -> torch.Tensor:
        return weights[name].to(device=device, dtype=torch.float64)

    embed = widened("model.embed_tokens.weight")
    yield "model.embed_tokens.weight", pad_columns(embed, hidden).to(dtype)
    for i in range(source.num_hidden_layers):
        prefix = f"model.layers.{i}."
        parts = {n: widened(f"{prefix}self_attn.{n}.weight") for n in ATTENTION}
        parts |= {n: widened(f"{prefix}mlp.{n}.weight") for n in MLP}
        layer = attention_weights(parts, narrow, shape) | mlp_weights(parts, narrow, shape)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            yield f"{prefix}{norm}.weight", norm_weight(widened(f"{prefix}{norm}.weight"), hidden).to(dtype)
        yield from _layer_items(prefix, layer, dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    for i in range(source.num_hidden_layers, num_layers):
        prefix = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            yield f"{prefix}{norm}.weight", torch.ones(hidden, dtype=dtype, device=device)
        yield from _layer_items(prefix, filler_layer(shape, generator, dtype), dtype)
    yield "model.norm.weight", norm_weight(widened("model.norm.weight"), hidden).to(dtype)
    if "lm_head.weight" in weights and not getattr(source, "tie_word_embeddings", False):
        yield "lm_head.weight", pad_columns(widened("lm_head.weight"), hidden).to(dtype)


def _layer_items(prefix: str, layer: dict[str, torch.Tensor], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for name in ATTENTION:
        yield f"{prefix}self_attn.{name}.weight", layer[name].to(dtype)
    for name in MLP:
        yield f"{prefix}mlp.{name}.weight", layer[name].to(dtype)

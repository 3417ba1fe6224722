"""The shipped drafters that read the target's hidden state, widened with it.

Medusa/blockwise heads read the target's last hidden state [h, 0] and the EAGLE head reads it with a
token's embedding [e, 0]: padded the same way as the target, with zero rows and columns for the new
dimensions, they compute what they compute on the shipped target, so they draft the same tokens. The
EAGLE head's decoder layer is a target layer (`widen`), at the twin's layer shape. Both keep their
draft vocabularies; their configs name the twin as the target they fit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from jobs.twin.widen import (
    LayerShape,
    attention_weights,
    mlp_weights,
    norm_weight,
    pad,
    pad_columns,
    place,
    twin_eps,
)
from strategies.artifacts.configs import (
    EAGLE_KIND,
    EagleConfig,
    HeadsConfig,
    read_eagle_config,
    read_heads_config,
)
from strategies.artifacts.weights_folder import load_weights


def twin_heads(
    folder: Path, hidden_size: int, fits: dict[str, str], device: torch.device | str = "cpu"
) -> tuple[dict[str, torch.Tensor], HeadsConfig]:
    """The Medusa/blockwise heads of `folder`: their state (float64, on `device`) and config for a twin
    of `hidden_size` (`fits`: the twin target's path and hash)."""
    config = read_heads_config(folder)
    square = torch.arange(config.hidden_size)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in load_weights(folder, "heads").items():
        wide = tensor.to(device=device, dtype=torch.float64)
        if name.startswith("projections."):
            out[name] = pad_columns(wide, hidden_size)
        elif name.endswith(".weight"):
            out[name] = place(wide, square, square, (hidden_size, hidden_size))
        else:
            out[name] = pad(wide, hidden_size)
    return out, dataclasses.replace(config, hidden_size=hidden_size, **fits)


def twin_eagle(
    folder: Path, shape: LayerShape, fits: dict[str, str], device: torch.device | str = "cpu"
) -> tuple[dict[str, torch.Tensor], EagleConfig]:
    """The EAGLE head of `folder`: its state (float64, on `device`) and config for a twin whose layers
    have `shape`."""
    config = read_eagle_config(folder)
    narrow = LayerShape(
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
    )
    wide = {name: t.to(device=device, dtype=torch.float64) for name, t in load_weights(folder, EAGLE_KIND).items()}
    hidden, twin_hidden = torch.arange(config.hidden_size), shape.hidden_size
    fc_columns = torch.cat([hidden, twin_hidden + hidden])  # the feature's, then the embedding's
    out = {
        "fc.weight": place(wide["fc.weight"], hidden, fc_columns, (twin_hidden, 2 * twin_hidden)),
        "fc.bias": pad(wide["fc.bias"], twin_hidden),
        "attn_norm": norm_weight(wide["attn_norm"], twin_hidden),
        "mlp_norm": norm_weight(wide["mlp_norm"], twin_hidden),
    }
    projections = {
        name.removesuffix(".weight"): tensor for name, tensor in wide.items() if name.endswith("_proj.weight")
    }
    layer = attention_weights(projections, narrow, shape) | mlp_weights(projections, narrow, shape)
    out |= {f"{name}.weight": tensor for name, tensor in layer.items()}
    twin_config = dataclasses.replace(
        config,
        hidden_size=twin_hidden,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        rms_norm_eps=twin_eps(config.rms_norm_eps, config.hidden_size, twin_hidden),
        **fits,
    )
    return out, twin_config

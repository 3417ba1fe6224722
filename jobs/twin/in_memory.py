"""A twin made straight into a device's memory, no file written: the device check's 7B twin.

`accelgen twin` writes a twin's folders (`command.py`); a GPU lent for minutes has no time to write
13 GB and read them back. Here the same widening runs on the device itself: `target.twin_tensors`
widens the source's few layers there in float64 and draws the filler layers there, and the model,
built on the `meta` device (no memory, no initialisation), takes those tensors as its parameters
(`load_state_dict(assign=True)`). The Medusa/blockwise heads and the EAGLE head are widened the same
way (`drafters`); the draft model is loaded as it is.

The same config gives the written twin's weights where the device is the CPU; on a GPU the filler
layers come from the GPU's generator (other random weights, as idle: their outputs are zero), so
every twin computes the source's function.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from jobs.twin.command import TwinConfig, TwinPlan, plan
from jobs.twin.drafters import twin_eagle, twin_heads
from jobs.twin.target import source_weights, twin_config, twin_tensors
from strategies.artifacts.configs import EAGLE_KIND, EagleConfig, HeadsConfig
from strategies.artifacts.draft_vocab import read_draft_vocab
from strategies.artifacts.eagle import EagleHead
from strategies.artifacts.heads import DraftHeads
from strategies.registry import Models
from strategies.runtime.runner import ModelRunner
from workers.model_loading import LOADERS, LoadedModels, Loading

Drafter = TypeVar("Drafter", DraftHeads, EagleHead)


@dataclass
class InMemoryTwin:
    """A twin on one device: its target, tokenizer (the source's) and widened drafters."""

    target: PreTrainedModel  # a LlamaForCausalLM, in eval mode
    tokenizer: PreTrainedTokenizerBase
    heads: DraftHeads | None
    eagle: EagleHead | None
    parameters: int  # the target's
    build_s: float  # from the config to the last weight on the device


def twin_in_memory(config: TwinConfig, device: torch.device) -> InMemoryTwin:
    """The twin `config` describes (`output_dir`, `shard_gb` unused), its weights in `config.dtype` on
    `device`; its drafters where `config.heads` / `config.eagle` name folders."""
    twin = plan(config)
    began = time.perf_counter()
    target = twin_target(twin, device, config.seed)
    fits = {"target_path": f"{twin.source_dir}, widened in memory", "target_weights_sha256": ""}
    heads = eagle = None
    if config.heads:
        weights, wide = twin_heads(Path(config.heads), twin.shape.hidden_size, fits, device)
        heads = _drafter(DraftHeads, wide, weights, Path(config.heads), "heads", twin.dtype, device)
        heads.use_lm_head(target.get_output_embeddings().weight)
    if config.eagle:
        weights, wide = twin_eagle(Path(config.eagle), twin.shape, fits, device)
        eagle = _drafter(EagleHead, wide, weights, Path(config.eagle), EAGLE_KIND, twin.dtype, device)
        eagle.use_target(target)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return InMemoryTwin(
        target,
        AutoTokenizer.from_pretrained(twin.source_dir),
        heads,
        eagle,
        sum(p.numel() for p in target.parameters()),
        time.perf_counter() - began,
    )


def twin_target(twin: TwinPlan, device: torch.device, seed: int) -> PreTrainedModel:
    """The twin target on `device`: built on `meta`, given the widened tensors as its parameters; tied
    weights tied again and the rotary frequencies (a buffer no state dict holds) computed anew."""
    config = twin_config(twin.source, twin.shape, twin.layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=twin.dtype)
    weights = source_weights(twin.source_dir)
    state = dict(twin_tensors(weights, twin.source, twin.shape, twin.layers, twin.dtype, seed, device))
    loaded = model.load_state_dict(state, assign=True, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if loaded.unexpected_keys or set(loaded.missing_keys) - tied:
        raise RuntimeError(
            f"the twin of {twin.source_dir} does not fit {type(model).__name__}: missing "
            f"{sorted(set(loaded.missing_keys) - tied)}, unexpected {sorted(loaded.unexpected_keys)}"
        )
    model.tie_weights()
    # Computed on the CPU and moved, as a model loaded from a folder has them: the same frequencies.
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config).to(device)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"the twin of {twin.source_dir} left {left} without values on the meta device")
    return model.eval().requires_grad_(False)


def _drafter(
    kind: Callable[[Any], Drafter],
    config: HeadsConfig | EagleConfig,
    weights: dict[str, torch.Tensor],
    folder: Path,
    name: str,
    dtype: torch.dtype,
    device: torch.device,
) -> Drafter:
    """A drafter of `kind` made on `device` in `dtype` holding `weights`, with the draft vocabulary of
    its source `folder` (as `load_heads` and `load_eagle` make one from a folder of its own)."""
    with torch.device(device):
        module = kind(config).to(dtype)
    module.load_state_dict(weights)
    module.eval().requires_grad_(False)
    module.use_draft_vocab(read_draft_vocab(folder, name, config.draft_vocab_size, config.vocab_size))
    return module


def twin_models(twin: InMemoryTwin, dtype: torch.dtype, device: torch.device, draft: str | None) -> LoadedModels:
    """The twin as the bench takes a job's models: its target's runner, its drafters, and the draft
    model of the folder `draft` (unchanged, loaded on first use; None: none)."""
    loaders = {}
    if draft:
        at = Loading(dtype, device, False, "the in-memory twin", twin.target, twin.tokenizer)
        loaders["draft"] = lambda: LOADERS["draft"](Path(draft), draft, at)
    models = Models(ModelRunner(twin.target), loaders=loaders, heads=twin.heads, eagle=twin.eagle)
    return LoadedModels(twin.tokenizer, twin.target, models, twin.build_s)

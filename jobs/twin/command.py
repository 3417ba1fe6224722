"""`accelgen twin`: a wide twin of the shipped family, the shipped target's function at a bigger model's cost.

The shipped target (6.8M parameters) fits in a CPU's cache, where a forward over 16 new tokens costs
several times one token's and no drafter can pay much. A twin of a real model's layer shapes reads
every weight from memory at each step, as a user's 0.5B-70B model does, while it computes exactly
the shipped target's tokens, so every drafter of the shipped family drafts on it as it does on the
shipped target: acceptance unchanged, costs a real model's. It is for measuring speed, not a better
model. Twins are made on demand and never committed (the 0.5B twin is 1.5 GB in float32); the device
check makes the 7B twin in a GPU's memory instead of writing it (`in_memory.py`).

    DIR/target   an ordinary Llama folder (transformers loads it), weights in shards of `shard_gb`
    DIR/heads    the shipped Medusa/blockwise heads, widened (`model.heads`)
    DIR/eagle    the shipped EAGLE head, widened (`model.eagle`)
    DIR/README.md  the card: what it is, its shape, how it was made

The draft model and the CMLM keep their own size and are used as they are (`model.draft`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import MISSING
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import AutoConfig, PretrainedConfig

from jobs.args import config_or_usage
from jobs.shipped import SHIPPED_TARGET, shipped
from jobs.twin.drafters import twin_eagle, twin_heads
from jobs.twin.target import layer_shape, source_weights, twin_config, twin_tensors
from jobs.twin.widen import LayerShape, layout_problem
from pipeline.errors import JobError
from strategies.artifacts.configs import write_weights_config
from strategies.config_option import option
from workers.common.model_files import weights_sha256

# Layer shapes of real models, with the shipped 8,192-token vocabulary (their LM heads are larger).
PRESETS = {
    "0.5b": (896, 24, 14, 2, 4864),  # Qwen2.5-0.5B
    "1.5b": (1536, 28, 12, 2, 8960),  # Qwen2.5-1.5B
    "7b": (4096, 32, 32, 32, 11008),  # Llama-2-7B
}
CUSTOM = "custom"
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
STORAGE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
WEIGHT_LESS = {"config.json", "README.md", "training.json"}  # files of the source folder not copied as they are


@dataclass
class TwinConfig:
    output_dir: str = option(
        MISSING, "Folder to write the twin to (target/, heads/, eagle/, README.md); must not exist."
    )
    shape: str = option(
        "0.5b",
        f"Preset layer shape: {', '.join(PRESETS)}; custom: the five shape keys alone (each also overrides a preset).",
    )
    hidden_size: int = option(0, "Hidden size; 0: the preset's.")
    num_hidden_layers: int = option(0, "Decoder layers (the source's, then filler layers); 0: the preset's.")
    num_attention_heads: int = option(0, "Query heads (head_dim = hidden_size / this); 0: the preset's.")
    num_key_value_heads: int = option(0, "Key/value heads; 0: the preset's.")
    intermediate_size: int = option(0, "MLP width; 0: the preset's.")
    source: str = option(str(SHIPPED_TARGET), "The target to widen: a local Llama folder.")
    heads: str | None = option(str(shipped("heads")), "Medusa/blockwise heads of the source to widen; null: none.")
    eagle: str | None = option(str(shipped("eagle")), "EAGLE head of the source to widen; null: none.")
    dtype: str = option("float32", f"Storage dtype of the twin target's weights: {', '.join(STORAGE_DTYPES)}.")
    seed: int = option(0, "Seed of the filler layers' random weights.")
    shard_gb: float = option(2.0, "Largest weights file of the twin target, GB.")


def resolve_shape(config: TwinConfig) -> tuple[LayerShape, int]:
    """The twin's layer shape and depth: the preset's, each key given overriding it; a JobError naming the key."""
    if config.shape != CUSTOM and config.shape not in PRESETS:
        raise JobError(
            f"shape={config.shape!r} is not a preset: use one of {', '.join(PRESETS)}, or {CUSTOM} and the five keys"
        )
    preset = dict(zip(SHAPE_KEYS, PRESETS.get(config.shape, (0,) * 5), strict=True))
    values = {key: getattr(config, key) or preset[key] for key in SHAPE_KEYS}
    missing = [key for key, value in values.items() if value <= 0]
    if missing:
        raise JobError(f"{', '.join(missing)} must be set (> 0) with shape={CUSTOM}")
    heads = values["num_attention_heads"]
    if values["hidden_size"] % heads:
        raise JobError(f"hidden_size={values['hidden_size']} is not a multiple of num_attention_heads={heads}")
    shape = LayerShape(
        values["hidden_size"],
        heads,
        values["num_key_value_heads"],
        values["hidden_size"] // heads,
        values["intermediate_size"],
    )
    return shape, values["num_hidden_layers"]


@dataclass(frozen=True)
class TwinPlan:
    """A twin that can compute its source's function: the source, the twin's shape and storage dtype."""

    source_dir: Path
    source: PretrainedConfig
    shape: LayerShape
    layers: int
    dtype: torch.dtype


def plan(config: TwinConfig) -> TwinPlan:
    """The twin `config` asks for, checked against its source; a JobError naming the key that is wrong."""
    if config.dtype not in STORAGE_DTYPES:
        raise JobError(f"dtype={config.dtype!r}: use one of {', '.join(STORAGE_DTYPES)}")
    source_dir = Path(config.source)
    source = AutoConfig.from_pretrained(source_dir)
    shape, layers = resolve_shape(config)
    problem = layout_problem(layer_shape(source), shape)
    if problem or layers < source.num_hidden_layers:
        problem = problem or f"num_hidden_layers={layers} is below the source's {source.num_hidden_layers}"
        raise JobError(f"a twin of {source_dir} cannot have this shape: {problem}")
    return TwinPlan(source_dir, source, shape, layers, STORAGE_DTYPES[config.dtype])


def build(config: TwinConfig) -> Path:
    """Write the twin of `config` and return its folder."""
    out = Path(config.output_dir)
    if out.exists():
        raise JobError(f"output_dir={out} exists: the twin is written to a new folder; remove it or name another")
    twin = plan(config)
    began = time.perf_counter()
    target_dir = out / "target"
    parameters = write_target(twin, target_dir, config)
    fits = {"target_path": str(target_dir), "target_weights_sha256": weights_sha256(target_dir)}
    if config.heads:
        weights, wide = twin_heads(Path(config.heads), twin.shape.hidden_size, fits)
        write_artifact(Path(config.heads), out / "heads", "heads", weights, wide)
    if config.eagle:
        weights, wide = twin_eagle(Path(config.eagle), twin.shape, fits)
        write_artifact(Path(config.eagle), out / "eagle", "eagle", weights, wide)
    write_card(out, config, twin, parameters)
    print(f"twin of {twin.source_dir} written to {out} in {time.perf_counter() - began:.1f} s")
    return out


def write_target(twin: TwinPlan, target_dir: Path, config: TwinConfig) -> int:
    """The twin target's folder: the source's tokenizer files, the twin's config and its weights in shards;
    returns its parameter count."""
    target_dir.mkdir(parents=True)
    for path in twin.source_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in WEIGHT_LESS:
            shutil.copy2(path, target_dir / path.name)
    wide = twin_config(twin.source, twin.shape, twin.layers)
    wide.dtype = config.dtype
    wide.save_pretrained(target_dir)
    weights = source_weights(twin.source_dir)
    count = 2 + 9 * twin.layers + ("lm_head.weight" in weights)
    tensors = twin_tensors(weights, twin.source, twin.shape, twin.layers, twin.dtype, config.seed)
    return write_shards(
        tqdm(tensors, total=count, desc="twin target", unit="tensor"), target_dir, config.shard_gb * 1e9
    )


def write_shards(tensors: Iterable[tuple[str, torch.Tensor]], target_dir: Path, shard_bytes: float) -> int:
    """Weights in files of at most `shard_bytes` each (one tensor may exceed it), each written as soon as
    it is full so that a twin larger than memory can be written; named and indexed as transformers
    shards a checkpoint, or one `model.safetensors`. Returns how many parameters it wrote."""
    written: list[list[str]] = []
    shard: dict[str, torch.Tensor] = {}
    size = total = parameters = 0
    for name, tensor in tensors:
        parameters += tensor.numel()
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            written.append(_write_shard(shard, target_dir, len(written)))
            shard, size = {}, 0
        shard[name] = tensor.contiguous()
        size, total = size + nbytes, total + nbytes
    written.append(_write_shard(shard, target_dir, len(written)))
    if len(written) == 1:
        (target_dir / _partial(0)).rename(target_dir / "model.safetensors")
        return parameters
    weight_map = {}
    for i, names in enumerate(written):
        file = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        (target_dir / _partial(i)).rename(target_dir / file)
        weight_map |= dict.fromkeys(names, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return parameters


def _partial(i: int) -> str:
    return f"shard-{i:05d}.partial"


def _write_shard(shard: dict[str, torch.Tensor], target_dir: Path, i: int) -> list[str]:
    save_file(shard, str(target_dir / _partial(i)), metadata={"format": "pt"})
    return list(shard)


def write_artifact(source_dir: Path, out: Path, kind: str, weights: dict[str, torch.Tensor], config: object) -> None:
    """A widened drafter's folder: its weights in float32 (as every artifact folder holds them), its
    config naming the twin, and the source's draft vocabulary as it is."""
    out.mkdir(parents=True)
    save_file({name: t.float().contiguous() for name, t in weights.items()}, str(out / f"{kind}.safetensors"))
    write_weights_config(out, kind, config)
    for path in source_dir.glob("draft_vocab.safetensors"):
        shutil.copy2(path, out / path.name)


def write_card(out: Path, config: TwinConfig, twin: TwinPlan, parameters: int) -> None:
    """DIR/README.md: what the twin is for, and what it is not."""
    source_dir, shape, layers = twin.source_dir, twin.shape, twin.layers
    target, narrow = AutoConfig.from_pretrained(out / "target"), twin.source
    made = f"accelgen twin output_dir={out} shape={config.shape} " + " ".join(
        f"{key}={getattr(config, key)}" for key in SHAPE_KEYS if getattr(config, key)
    )
    (out / "README.md").write_text(
        f"""# A wide twin of {source_dir.name}

For measuring speed, not a better model. This folder computes the function of `{source_dir}`
(greedy tokens identical in float64) at the cost of a model of {parameters / 1e6:.1f}M parameters:

| | twin | source |
|---|---|---|
| hidden size | {shape.hidden_size} | {narrow.hidden_size} |
| layers | {layers} (the source's first, then filler layers) | {narrow.num_hidden_layers} |
| query / key-value heads, head dim | {shape.num_attention_heads} / {shape.num_key_value_heads}, {shape.head_dim} \
| {narrow.num_attention_heads} / {narrow.num_key_value_heads}, {narrow.head_dim} |
| MLP width | {shape.intermediate_size} | {narrow.intermediate_size} |
| vocabulary | {target.vocab_size} (the source's tokenizer; a real model of this shape has a larger LM head) | |
| weights | {config.dtype} | |

How: the source's weights zero-padded to the wider shape, RMSNorm weights and epsilon rescaled for
the padded width, query heads placed beside copies of the key/value heads they read, queries scaled
for a wider head dimension, and filler layers whose output projections are zero (they cost a layer
and add nothing). `heads/` and `eagle/` are the source's drafters widened the same way: they draft
what they draft on the source. The draft model is used as it is.

In float32 and lower precision the twin rounds differently from the source (its sums run over
more, zero, terms and its norms are rescaled), so near-ties can resolve otherwise.

Made with: `{made}`
"""
    )


def main(args: list[str]) -> int:
    config = config_or_usage("usage: accelgen twin [CONFIG.yaml] [key=value ...]", TwinConfig(), args)
    if config is not None:
        build(config)
    return 0

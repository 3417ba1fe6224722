"""The device check's `twin_7b` step: acceleration where users run, a 7B-shaped target on a GPU.

The twin of the shipped family at Llama-2-7B's layer shapes (`command.PRESETS["7b"]`: 6.5B
parameters with the shipped 8,192-token LM head, 13 GB in bfloat16) is made straight into the GPU's
memory (`in_memory`), then decoded with `autoregressive`, `eagle` and `auto` at batch 1 and 8, 64 new
tokens, through the bench's own in-process machinery (`jobs.bench.decoding.Bench`: warm-up,
interleaved repeats, medians) over the shipped sample prompts (the GPU machine has no data sets). The
twin's drafters are the shipped ones widened (`drafters`); the draft model is the shipped one, as it
is, for `auto` to choose.

Recorded: the build time and size, and per batch size and strategy tokens per second, the speed-up
over autoregressive (median of per-round ratios, and their range), τ, and token agreement with plain
decoding (in bfloat16 a verify forward rounds otherwise than a plain step: README, "What lossless
means in low precision"). The aim: eagle and auto at least 2.5x autoregressive at batch 1 (the EAGLE
paper reports 2.7-3.5x on 7B-13B targets). Not built yet: CUDA graphs of the plain and verify steps;
every step launches its kernels one by one from Python.

`dry_run`: a twin twice the shipped width in float32 on the CPU, 4 new tokens, one repeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from jobs.bench.decoding import Bench
from jobs.bench.settings import BenchConfig
from jobs.shipped import SAMPLE_PROMPTS, shipped_or_none
from jobs.twin.command import TwinConfig
from jobs.twin.in_memory import twin_in_memory, twin_models

STRATEGIES = ["autoregressive", "eagle", "auto"]
AIM_BATCH1 = 2.5  # eagle and auto over autoregressive at batch 1


@dataclass(frozen=True)
class StepSize:
    """How big the step runs: the twin (`TwinConfig` keys) and what the bench decodes with it."""

    twin: dict[str, Any]
    sizes: tuple[tuple[int, int], ...]  # (batch size, prompts decoded per contender)
    max_new_tokens: int
    repeats: int
    max_prompt_tokens: int


# Batch 1 over few prompts keeps the step inside its limit.
ON_DEVICE = StepSize({"shape": "7b", "dtype": "bfloat16"}, ((1, 4), (8, 8)), 64, 2, 256)
DRY_RUN = StepSize(
    {
        "shape": "custom",
        "hidden_size": 512,
        "num_hidden_layers": 7,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "dtype": "float32",
    },
    ((1, 2), (8, 8)),
    4,
    1,
    32,
)


def twin_step(
    dry_run: bool, save: Callable[[dict[str, Any]], None] = lambda found: None, size: StepSize | None = None
) -> dict[str, Any]:
    """The step's results, at `size` (None: `ON_DEVICE` on a GPU, `DRY_RUN` on the CPU or with
    `dry_run`); `save` gets them after the build and after each batch size, so a step cut short by its
    time limit keeps what it measured."""
    cuda = torch.cuda.is_available() and not dry_run
    device = torch.device("cuda" if cuda else "cpu")
    size = size or (ON_DEVICE if cuda else DRY_RUN)
    config = TwinConfig(**size.twin)
    twin = twin_in_memory(config, device)
    target = twin.target.config
    found: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "shape": config.shape,
        "layers": target.num_hidden_layers,
        "hidden_size": target.hidden_size,
        "parameters": twin.parameters,
        "dtype": config.dtype,
        "build_s": round(twin.build_s, 2),
        "gpu_memory_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 1) if cuda else None,
        "max_new_tokens": size.max_new_tokens,
        "cuda_graphs": False,
        "rows": [],
    }
    save(found)
    loaded = twin_models(twin, twin.target.dtype, device, shipped_or_none("draft"))
    for batch_size, prompts in size.sizes:
        bench = BenchConfig(
            prompts=str(SAMPLE_PROMPTS),
            num_prompts=prompts,
            strategies=STRATEGIES,
            transformers=[],
            batch_sizes=[batch_size],
            max_new_tokens=size.max_new_tokens,
            max_prompt_tokens=size.max_prompt_tokens,
            repeats=size.repeats,
            pack_weights=False,  # packing is the CPU's (a no-op on a GPU); timing its kernels, the dry run's most
        )
        began = time.perf_counter()
        found["rows"] += [summary(row) for row in Bench(bench, loaded=loaded).run()]
        found.setdefault("bench_s", {})[batch_size] = round(time.perf_counter() - began, 1)
        found["aim_batch1_met"] = aim_met(found["rows"])
        save(found)
    return found


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """What the step keeps of a bench row."""
    kept = ("batch_size", "contender", "tokens_per_s", "x_autoregressive", "x_autoregressive_range", "tau")
    return {**{key: row[key] for key in kept}, "token_agreement": row["agreement"]["token_accuracy"]}


def aim_met(rows: list[dict[str, Any]]) -> bool | None:
    """Whether eagle and auto reached `AIM_BATCH1` times autoregressive at batch 1; None before it ran."""
    ratios = [r["x_autoregressive"] for r in rows if r["batch_size"] == 1 and r["contender"] in ("eagle", "auto")]
    return all(x is not None and x >= AIM_BATCH1 for x in ratios) if len(ratios) == 2 else None

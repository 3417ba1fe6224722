"""`accelgen bench`: our strategies against transformers' `generate`, side by side in one run.

Every configuration does the same work (fixed-length generation: EOS ignored, `min_new_tokens` for
`generate`), repeats are interleaved so drift on a noisy machine hits all alike, and the table
reports medians and ratios. It also reports the share of rows whose tokens equal `generate`'s
greedy output in the working dtype (DESIGN.md: a different matmul shape can flip a near-tie).
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from jobs.cli import SAMPLE_PROMPTS, SHIPPED_TARGET, print_keys, split_args
from pipeline.config import _opt, load_config
from pipeline.errors import JobError
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.options import StrategyOptions
from strategies.runner import ModelRunner
from strategies.sampling import SamplingParams, row_key
from workers.model_loading import load_model, resolve_dtype, resolve_model_dir
from workers.storage import filesystem


@dataclass
class BenchConfig:
    prompts: str = _opt(str(SAMPLE_PROMPTS), "Prompts: a Parquet URL, or a JSONL(.gz) file with a prompt field.")
    prompt_column: str = _opt("prompt", "Column (Parquet) or field (JSONL) holding the prompt.")
    model: str = _opt(str(SHIPPED_TARGET), "Target model: local folder or fsspec URL.")
    dtype: str = _opt("auto", "Model dtype; auto: float32 on CPU, bfloat16 on GPU.")
    strategies: list[str] = _opt(["autoregressive"], "Our strategies to time.")
    batch_sizes: list[int] = _opt([1, 32], "Batch sizes to time.")
    max_new_tokens: int = _opt(64, "Tokens generated per row (fixed length).")
    max_prompt_tokens: int = _opt(256, "Prompts are cut to their last this many tokens.")
    repeats: int = _opt(3, "Interleaved repeats per configuration; the table shows medians.")
    torch_threads: int = _opt(0, "torch threads; 0: all cores.")
    baseline: bool = _opt(True, "Also time transformers' generate (the ratios' denominator).")


def read_prompts(url: str, column: str) -> list[str]:
    fs, path = filesystem(url, {})
    if path.endswith((".jsonl", ".jsonl.gz")):
        with fs.open(path, "rb") as f:
            data = gzip.decompress(f.read()) if path.endswith(".gz") else f.read()
        return [json.loads(line)[column] for line in data.decode("utf-8").splitlines() if line.strip()]
    import pyarrow.parquet as pq

    with fs.open(path, "rb") as f:
        return [p for p in pq.read_table(f, columns=[column]).column(column).to_pylist() if p]


def _time(fn: Callable[[], list[list[int]]]) -> tuple[float, list[list[int]]]:
    started = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - started, tokens


def run(config: BenchConfig) -> list[dict]:
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(config.dtype, device)
    model, tokenizer = load_model(resolve_model_dir(config.model), dtype, device)
    runner = ModelRunner(model)
    texts = read_prompts(config.prompts, config.prompt_column)
    if not texts:
        raise JobError(f"bench prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    prompts = [ids[-config.max_prompt_tokens :] for ids in tokenizer(texts)["input_ids"]]
    n = config.max_new_tokens
    params = GenerationParams(n, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = []
    for batch_size in config.batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(batch_size)]

        def hf_generate(batch=batch) -> list[list[int]]:
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=pad,
                )
            return out[:, width:].tolist()

        contenders: dict[str, Callable[[], list[list[int]]]] = {}
        if config.baseline:
            contenders["transformers.generate"] = hf_generate
        for name in config.strategies:
            strategy = registry.create(StrategyOptions(name=name), runner)
            requests = [RowRequest(p, row_key(str(i))) for i, p in enumerate(batch)]
            contenders[name] = lambda s=strategy, r=requests: [row.tokens for row in s.generate(r, params).rows]
        for fn in contenders.values():  # warm-up: first calls allocate and pick kernels
            fn()
        times: dict[str, list[float]] = {name: [] for name in contenders}
        outputs: dict[str, list[list[int]]] = {}
        for _ in range(config.repeats):
            for name, fn in contenders.items():
                wall_s, outputs[name] = _time(fn)
                times[name].append(wall_s)
        base = statistics.median(times["transformers.generate"]) if config.baseline else None
        for name in contenders:
            wall_s = statistics.median(times[name])
            same = None
            if config.baseline:
                same = (
                    sum(a == b for a, b in zip(outputs[name], outputs["transformers.generate"], strict=True))
                    / batch_size
                )
            rows.append(
                {
                    "batch_size": batch_size,
                    "contender": name,
                    "median_wall_s": round(wall_s, 4),
                    "tokens_per_s": round(batch_size * n / wall_s, 1),
                    "speedup_vs_generate": round(base / wall_s, 3) if base else None,
                    "rows_equal_to_generate": same,
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'batch':>5}  {'contender':<24} {'wall_s':>8} {'tokens/s':>10} {'x generate':>10} {'same rows':>9}"
    print(header)
    for r in rows:
        ratio = f"{r['speedup_vs_generate']:.2f}x" if r["speedup_vs_generate"] else "-"
        same = f"{r['rows_equal_to_generate']:.0%}" if r["rows_equal_to_generate"] is not None else "-"
        print(
            f"{r['batch_size']:>5}  {r['contender']:<24} {r['median_wall_s']:>8.3f} {r['tokens_per_s']:>10.1f} "
            f"{ratio:>10} {same:>9}"
        )


def main(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        print_keys("usage: accelgen bench [CONFIG.yaml] [key=value ...]\n\nkeys:", BenchConfig())
        return 0
    yaml_path, overrides = split_args(args)
    config = load_config(BenchConfig(), yaml_path, overrides)
    unknown = sorted(set(config.strategies) - set(registry.available()))
    if unknown:
        raise JobError(f"strategies: unknown {unknown}; available: {', '.join(registry.available())}")
    print_table(run(config))
    return 0

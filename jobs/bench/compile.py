"""Does `torch.compile` of the decode step pay on this machine? Compile time against per-step saving.

    python -m jobs.bench.compile [batch_sizes=[1,8]] [max_new_tokens=64] [mode=whole|layers] [dtype=float32]

Times greedy `autoregressive` decoding of the same prompts with the lean Llama forward
(`strategies/runtime/llama_forward.py`) eager and compiled, and prints the first pass's extra time (the
compile, with every recompile it triggers), the steady per-step time of each, and how many steps a
job must decode before the compile has paid for itself. Modes:
- whole: `torch.compile` of the whole forward, the ragged cache's appends inside the graph;
- layers: what `model.compile=true` does (`LlamaForward.compile`): the cache append and attention
  stay eager, the parts of each layer around them (norms, projections, rotary, MLP) are compiled.
Not a test: compiling takes tens of seconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import torch

from jobs.shipped import SAMPLE_PROMPTS, SHIPPED_TARGET
from pipeline.config import load_config
from pipeline.errors import JobError
from pipeline.prompt_files import read_prompts
from strategies.base import GenerationParams, RowRequest
from strategies.config_option import option
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime.sampling import SamplingParams, row_key
from workers.model_loading import load_models, resolve_dtype


@dataclass
class CompileBench:
    prompts: str = option(str(SAMPLE_PROMPTS), "Prompts: a Parquet URL, or a JSONL(.gz) file with a prompt field.")
    prompt_column: str = option("prompt", "Column (Parquet) or field (JSONL) holding the prompt.")
    model: str = option(str(SHIPPED_TARGET), "Target model (a Llama-family model: the lean forward).")
    dtype: str = option("float32", "Model dtype.")
    batch_sizes: list[int] = option([1, 8], "Batch sizes to time.")
    max_new_tokens: int = option(64, "Tokens per row (fixed length).")
    repeats: int = option(3, "Steady passes per variant (the table shows medians).")
    mode: str = option("layers", "whole or layers (see the module's docstring).")
    dynamic: bool = option(True, "mode=whole: torch.compile(dynamic=...); mode=layers is model.compile's (dynamic).")
    torch_threads: int = option(0, "torch threads; 0: all cores.")


def main(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    config = load_config(CompileBench(), None, args)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device = torch.device("cpu")
    texts = read_prompts(config.prompts, config.prompt_column)
    eager = load_models(config.model, resolve_dtype(config.dtype, device), device)
    compiled = load_models(config.model, resolve_dtype(config.dtype, device), device)
    runner = compiled.models.target
    if runner._fast is None:
        raise JobError(f"bench_compile: {config.model} does not take the lean Llama forward")
    if config.mode == "whole":
        runner._fast = torch.compile(runner._fast.__call__, dynamic=config.dynamic)
    elif config.mode == "layers":
        runner.compile()
    else:
        raise JobError(f"bench_compile: mode must be whole or layers, got {config.mode!r}")
    prompts = [ids[-256:] for ids in eager.tokenizer(texts)["input_ids"]]
    n = config.max_new_tokens
    params = GenerationParams(n, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    print(f"mode={config.mode} dynamic={config.dynamic} dtype={config.dtype} threads={torch.get_num_threads()}")
    for batch_size in config.batch_sizes:
        batch = [RowRequest(prompts[i % len(prompts)], row_key(str(i))) for i in range(batch_size)]
        strategies = {"eager": AutoregressiveStrategy(eager.models.target), "compiled": AutoregressiveStrategy(runner)}
        first, steady, tokens = {}, {}, {}
        for name, strategy in strategies.items():
            started = time.perf_counter()
            tokens[name] = [r.tokens for r in strategy.generate(batch, params).rows]
            first[name] = time.perf_counter() - started
            walls = []
            for _ in range(config.repeats):
                started = time.perf_counter()
                strategy.generate(batch, params)
                walls.append(time.perf_counter() - started)
            steady[name] = statistics.median(walls)
        steps = n  # one prefill and n - 1 decode steps, counted as n
        saving = (steady["eager"] - steady["compiled"]) / steps
        compile_s = first["compiled"] - steady["compiled"] - max(first["eager"] - steady["eager"], 0.0)
        pays = f"{compile_s / saving:.0f} steps" if saving > 0 else "never"
        print(
            f"batch {batch_size}: eager {steady['eager'] / steps * 1e3:.2f} ms/step, compiled "
            f"{steady['compiled'] / steps * 1e3:.2f} ms/step, compile {compile_s:.1f}s; pays back after {pays}; "
            f"same greedy tokens: {tokens['eager'] == tokens['compiled']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

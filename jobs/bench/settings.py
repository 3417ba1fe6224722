"""The keys of `accelgen bench`: what every mode of the bench (in-process, `costs=true`, `job=true`,
`prefix=true`) reads, apart from the code of any mode, so the command can parse them before choosing one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from jobs.shipped import SAMPLE_PROMPTS, SHIPPED_TARGET, shipped_or_none
from strategies.config_option import option
from strategies.options import StrategyOptions
from workers.common.model_kinds import KINDS


@dataclass
class _BenchSettings:
    prompts: str = option(str(SAMPLE_PROMPTS), "Prompts: a Parquet URL, or a JSONL(.gz) file with a prompt field.")
    prompt_column: str = option("prompt", "Column (Parquet) or field (JSONL) holding the prompt.")
    num_prompts: int = option(16, "Prompts decoded per contender and batch size (cycled to fill a batch).")
    model: str = option(str(SHIPPED_TARGET), "Target model: local folder or fsspec URL.")
    dtype: str = option("auto", "Model dtype; auto: float32 on CPU, bfloat16 on GPU.")
    strategies: list[str] = option(["autoregressive"], "Our strategies to time (strategy.* below sets options).")
    mask_predict_iterations: list[int] = option(
        [],
        "With mask_predict among the strategies: time it at each of these passes T (e.g. [1,2,4,10]), one "
        "contender each. Empty: strategy.mask_predict.iterations alone.",
    )
    drafters: list[str] = option(
        [],
        "With speculative or specdec among the strategies: time it with each of these drafters (draft_model, "
        "cmlm), one contender each. Empty: strategy.<name>.drafter alone.",
    )
    eagle_trees: list[str] = option(
        [],
        "With eagle among the strategies: time it with each of these trees (chain, static, dynamic), one contender "
        "each, the other strategy.eagle.* options shared. Empty: strategy.eagle.tree alone.",
    )
    lookup_sizings: list[str] = option(
        [],
        "With prompt_lookup among the strategies: time it with each of these draft sizings (acceptance, fixed), one "
        "contender each. Empty: strategy.prompt_lookup.sizing alone.",
    )
    lookahead_nodes: list[int] = option(
        [],
        "With lookahead among the strategies: time it with each of these tree budgets (its decoding_length), one "
        "contender each. Empty: strategy.lookahead.decoding_length alone.",
    )
    lookahead_lookup_first: list[bool] = option(
        [],
        "With lookahead among the strategies: time it with prompt lookup tried first and without (true, false), one "
        "contender each. Empty: strategy.lookahead.prompt_lookup_first alone.",
    )
    adaptive_growths: list[float] = option(
        [],
        "With auto (or a strategy under strategy.adaptive=true) among the strategies: time it with each of these "
        "strategy.adaptive_growth values, one contender each. Empty: strategy.adaptive_growth alone.",
    )
    transformers: list[str] = option(
        ["generate"], "transformers contenders: generate, assisted, prompt_lookup (the last two at batch 1)."
    )
    batch_sizes: list[int] = option([1, 32], "Batch sizes to time.")
    max_new_tokens: int = option(64, "Tokens generated per row (fixed length).")
    max_prompt_tokens: int = option(256, "Prompts are cut to their last this many tokens.")
    repeats: int = option(
        3, "Rounds per configuration, the contenders taking turns batch by batch in each; the table shows medians."
    )
    torch_threads: int = option(
        0, "torch threads; 0: all cores (job=true: as many as a job's actor runs, `workers.torch_threads`)."
    )
    pack_weights: bool = option(
        True,
        "Float32 on CPU: matmuls through packed weights (oneDNN, MKL, a transposed copy) where timed faster "
        "(`model.pack_weights`); false: F.linear.",
    )
    compare_f_linear: bool = option(
        False,
        "With pack_weights: also time each of our contenders with F.linear ('<name> F.linear'), interleaved with "
        "the rest, so the table shows what packing gains in one run.",
    )
    # Fixed strategies are measured as themselves (adaptive=false); `auto` always runs its controller.
    strategy: StrategyOptions = field(default_factory=lambda: StrategyOptions(adaptive=False))
    new_controllers: bool = option(
        False,
        "`auto` and adaptive contenders start each pass with a new controller, as a cold job's actor does; "
        "false: a contender's controller lives on from pass to pass, as it does across an actor's batches.",
    )
    report: str = option("", "Also write the table as JSON to this path.")
    lookup_tokens: int = option(
        0, "transformers' prompt_lookup_num_tokens; 0: strategy.num_speculative_tokens (the draft length of ours)."
    )
    # The cost table (jobs/bench/costs.py): forwards by batch x new tokens, plain and drafting steps by phase.
    costs: bool = option(
        False, "Print the cost table instead: forwards by batch size x new tokens, and each strategy's step by phase."
    )
    cost_new_tokens: list[int] = option([1, 2, 4, 8, 16], "costs=true: new tokens per row of each timed forward.")
    cost_cache_tokens: int = option(200, "costs=true: cached tokens per row under each timed forward.")
    structured: bool = option(
        False,
        "Measure structured outputs instead (jobs/bench/structured.py): the JSON-schema synthesis set of num_prompts "
        "rows, autoregressive and auto, constrained, unconstrained and under a format allowing any text (the "
        "grammar's own cost on the same tokens), at the first of batch_sizes.",
    )
    # Whole jobs (jobs/bench/job.py): each contender runs as `accelgen generate` processes.
    job: bool = option(False, "Time whole `accelgen generate` jobs, cold and warm, instead of in-process decoding.")
    job_shards: int = option(3, "job=true: input shards the num_prompts rows are split into.")
    warm: bool = option(True, "job=true: after each cold job, time a warm one (the next job, new output folder).")
    job_overrides: list[str] = option([], "job=true: key=value given to every job (e.g. workers.torch_threads=2).")
    warm_cache_key: str = option(
        "",
        "job=true: the job key of a cache shared between jobs (e.g. the controller's statistics URL): each cold job "
        "gets a new empty one, the warm job after it the same. Empty: jobs share nothing.",
    )
    # Whole jobs on rows sharing one long prefix (jobs/bench/prefix.py), with and without the prefix cache.
    prefix: bool = option(
        False,
        "Time whole jobs on num_prompts rows that share one long prefix, with the prefix cache and with "
        "model.prefix_cache_mb=0, per strategy and batch size; outputs compared.",
    )
    prefix_tokens: int = option(700, "prefix=true: tokens of the prefix every row shares.")
    suffix_tokens: int = option(50, "prefix=true: tokens of each row's own text after it.")
    vllm: list[str] = option(
        ["plain", "ngram"], "job=true: vLLM peers: plain (offline generate), ngram (its n-gram speculation)."
    )
    vllm_python: str = option(
        "", "job=true: python of a virtual environment holding vLLM (docs/benchmarks.md); empty: vLLM not measured."
    )


def _bench_config() -> type:
    """The bench's keys: its settings, then one key per optional model kind (`workers/common/model_kinds.py`),
    the shipped family's by default, as the job's `model.<kind>`."""
    kinds = [(kind.name, str | None, option(shipped_or_none(kind.name), kind.help)) for kind in KINDS]
    config = dataclasses.make_dataclass("BenchConfig", kinds, bases=(_BenchSettings,))
    config.__module__ = __name__
    return config


BenchConfig = _bench_config()

"""The sections of a job's config that an actor reads (`model`, `input`, `output`, `generation`,
`workers`): the driver hands them to every actor in its `WorkerSpec` as they are, so a setting an actor
uses is read where it is declared, and a new one is a field here, not a field copied into the spec too.
`pipeline/config.py` assembles them with the `strategy` and `ray` sections into the job's `JobConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from strategies.config_option import option
from workers.common.model_kinds import BY_NAME, KINDS

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


@dataclass
class InputConfig:
    url: str = option(
        MISSING, "Parquet or JSON Lines input: a file, a directory or a glob; any fsspec URL (s3://, gs://, …)."
    )
    format: str | None = option(
        None,
        "parquet, jsonl (one JSON object per line; the *_column keys name its fields) or openai_batch (OpenAI "
        "Batch API request lines: custom_id is the row id, the body gives the prompt or messages and the row's "
        "settings). Empty: jsonl when every input file is named *.jsonl, *.ndjson or *.json (each optionally "
        "followed by .gz, .bz2 or .xz: compressed, read whole as one unit), parquet when none is, and an "
        "error when the names are mixed.",
    )
    prompt_column: str = option("prompt", "Column holding the prompt text.")
    id_column: str | None = option(
        None, "Column holding a unique row id. Empty: ids are derived from shard path and row index."
    )
    messages_column: str | None = option(
        None,
        "Column of chat messages (a list of {role, content} structs, or JSON text of one), rendered through "
        "the tokenizer's chat template with the generation prompt. Set: input.prompt_column is not read.",
    )
    keep_columns: list[str] = option(
        [],
        "Input columns copied unchanged into the output (JSON Lines fields: a string as it is, other values "
        "as their JSON text).",
    )
    strategy_column: str | None = option(
        None, "Optional column naming a strategy per row (empty values: strategy.name); unknown: an error row."
    )
    params_columns: dict[str, str] = option(
        {},
        "Per-row settings: {setting: column} for settings among max_new_tokens, temperature, top_p, stop, seed, "
        "presence_penalty, frequency_penalty, repetition_penalty, min_p, min_tokens, stop_token_ids (a list<int64> "
        "column), logit_bias (a map<int64, double> column, or JSON text of an object), response_format (JSON text of "
        "one, as generation.response_format); a row's non-null value "
        "overrides generation.<setting>, a bad one makes an error row.",
    )
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the input (endpoint, credentials).")
    rows_per_unit: int = option(
        4096,
        "Shards with more rows are split into work units of whole row groups up to about this size; plain "
        "(uncompressed) JSON Lines files into runs of this many rows.",
    )


@dataclass
class OutputConfig:
    url: str = option(MISSING, "Output folder; any fsspec URL. Parts, manifest, _SUCCESS and _logs/ go here.")
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the output.")
    logprobs: bool = option(
        False,
        "Add `logprobs`: each generated token's log-probability under the target (raw log-softmax of its "
        "logits, before temperature and top-k/top-p).",
    )
    top_logprobs: int = option(
        0, "Add `top_logprobs`: per generated token, the target's k most likely tokens (at most max_top_logprobs)."
    )
    max_top_logprobs: int = option(
        20,
        "Ceiling of top_logprobs (vLLM's max_logprobs default): each generated token stores k entries, so a large k "
        "multiplies the output's size. Raise it to ask for more.",
    )
    token_ids: bool = option(False, "Add `token_ids`: the generated token ids.")
    format: str = option(
        "parquet",
        "Format of the parts (part-<unit>.parquet, or .jsonl): parquet; jsonl (the same columns, one JSON object "
        "per output row); openai_batch (OpenAI Batch API response lines, one per input row, custom_id its "
        "row_id, its samples as choices; failed rows as error lines; no keep_columns or score columns).",
    )


_PREFIX_CACHE_HELP = (
    "MiB of prompt prefixes each actor keeps computed (every layer's keys and values of 16-token blocks, on the "
    "model's device), per model that prefills (the target, and a draft model): a prefix that rows share, within a "
    "batch or across batches and units, is prefilled once; least recently used blocks go first. 0: none. Outputs "
    "are the same either way (docs/operations.md, 'Shared prompt prefixes')."
)


def _model_config() -> type:
    """`model.*`: the target, one key per optional model kind (`workers/common/model_kinds.py`: a new kind is a
    new key without an edit here), and how every model loads."""
    fields = [
        ("target", str, option(MISSING, "Hugging Face causal LM: a local directory or an fsspec URL of one.")),
        *((kind.name, str | None, option(None, kind.help)) for kind in KINDS),
        (
            "dtype",
            str,
            option(
                "auto",
                f"One of {DTYPES}. auto: bfloat16 on GPU; on CPU, bfloat16 where the CPU has bfloat16 matrix "
                "hardware (the amx_bf16 or avx512_bf16 flag in /proc/cpuinfo: the instructions oneDNN runs "
                "bfloat16 matmuls on; without them it converts to float32 and bfloat16 rarely pays) and a decode "
                "step of this model, timed in both as the first actor starts, is at least 10% faster in it; float32 "
                "elsewhere. Chosen once per job, printed, recorded in its identity, and reused on resume.",
            ),
        ),
        ("trust_remote_code", bool, option(False, "Allow model code shipped with the checkpoint to run.")),
        (
            "compile",
            bool,
            option(
                False,
                "torch.compile each layer's parts around attention (Llama-family targets): fewer, fused operations "
                "per step, after a compile of tens of seconds per actor "
                "(docs/performance.md, 'torch.compile of the decode step').",
            ),
        ),
        (
            "pack_weights",
            bool,
            option(
                True,
                "Float32 on CPU: matmuls through a copy of the weights made once for the kernel (oneDNN's, MKL's, "
                "or F.linear's sgemm over the weights transposed) whose whole forwards timed fastest at each row "
                "count as the actor started (a second copy of the weights in memory). False: F.linear everywhere "
                "(docs/performance.md, 'Weights packed for oneDNN').",
            ),
        ),
        ("prefix_cache_mb", float, option(512.0, _PREFIX_CACHE_HELP)),
        ("cache_dir", str, option("", "Where remote models are downloaded. Empty: ~/.cache/accelgen/models.")),
        (
            "storage_options",
            dict[str, Any],
            option(
                {},
                f"fsspec storage options for models at URLs (target, {', '.join(BY_NAME)}): endpoint, credentials.",
            ),
        ),
    ]
    config = dataclasses.make_dataclass("ModelConfig", fields)
    config.__module__ = __name__  # where pickling (Ray) finds it
    return config


ModelConfig = _model_config()


@dataclass
class GenerationConfig:
    max_new_tokens: int = option(128, "Most tokens generated per row (finish_reason=length when reached).")
    temperature: float = option(0.0, "0: greedy decoding. >0: sampling at this temperature.")
    top_p: float = option(1.0, "Nucleus sampling mass, in (0, 1].")
    top_k: int = option(0, "Sample among the k most likely tokens; 0: no limit.")
    stop: list[str] = option([], "Stop strings: end the row (finish_reason=stop); not part of the completion.")
    seed: int = option(0, "Sampling seed; a row's draws are keyed by (seed, row_id, position).")
    ignore_eos: bool = option(False, "Keep generating past EOS (fixed-length runs, benchmarks).")
    presence_penalty: float = option(
        0.0, "In [-2, 2]: subtracted from the logit of every token the row has already generated (OpenAI's)."
    )
    frequency_penalty: float = option(
        0.0, "In [-2, 2]: subtracted from a token's logit once per time the row has already generated it (OpenAI's)."
    )
    repetition_penalty: float = option(
        1.0,
        "> 0; 1: none. Tokens of the prompt and of the output so far: positive logits divided by it, negative ones "
        "multiplied (transformers', vLLM's).",
    )
    min_p: float = option(
        0.0,
        "In [0, 1]; 0: none. Sampling keeps only tokens at least min_p times as likely as the most likely one, at "
        "the temperature (vLLM's); no effect at temperature 0.",
    )
    min_tokens: int = option(
        0, "EOS and stop_token_ids cannot be generated until the row has this many tokens (stop strings still end it)."
    )
    stop_token_ids: list[int] = option(
        [],
        "Token ids that end the row (finish_reason=stop) like EOS; the token is part of the output (and of its text, "
        "unless a special token), as vLLM's.",
    )
    logit_bias: dict[int, float] = option(
        {},
        "{token id: bias in [-100, 100]} added to the token's logit before anything else (OpenAI's): -100 bans a "
        "token, 100 all but forces it.",
    )
    response_format: dict[str, Any] | None = option(
        None,
        "Structured output, OpenAI's shape: {type: json_object}, {type: json_schema, json_schema: {name, schema}}, "
        "{type: regex, pattern}, {type: choice, choices: [...]}, {type: grammar, ebnf} (llguidance's Lark syntax) "
        "or {type: text} (none). Every token is one the format allows; a row ending by length may not parse.",
    )
    n: int = option(
        1,
        "Completions per input row: n output rows, sample_index 0..n-1, each drawn with its own key "
        "(seed, row_id, sample_index, position). n > 1 needs temperature > 0.",
    )


@dataclass
class WorkersConfig:
    num_actors: int = option(0, "Generator actors. 0: one per GPU of the cluster, or one CPU actor without GPUs.")
    batch_size: int = option(
        16, "Most rows decoding at once on an actor, from any of its units: rows join as others finish."
    )
    max_batch_tokens: int = option(
        16384, "Most prompt + max_new_tokens tokens of the rows decoding at once (a longer row decodes alone)."
    )
    num_gpus_per_actor: float = option(1.0, "GPUs reserved per actor when the cluster has GPUs.")
    num_cpus_per_actor: float = option(
        1.0, "CPUs reserved per actor. At least one CPU of the cluster always stays free for Ray's own tasks."
    )
    custom_resources: dict[str, float] = option(
        {}, "Ray custom resources each actor needs (e.g. {accelerator_type_H100: 0.001}) to pin actors to nodes."
    )
    torch_threads: int = option(
        0,
        "torch intra-op threads per actor. 0: the cluster's cores less one for the driver and Ray (every core where "
        "a local target's weights times workers.batch_size reach 128 MiB), shared among the actors (at least one).",
    )
    actor_start_timeout_s: float = option(
        300.0, "Fail the job when the actors are not scheduled and loaded within this many seconds."
    )
    max_unit_attempts: int = option(3, "Attempts per work unit before the unit is reported failed.")
    unit_timeout_s: float = option(
        900.0, "An attempt that finishes no batch for this long is taken as hung: its actor restarts, the unit retries."
    )
    controller_stats_url: str | None = option(
        None,
        "A shared controller statistics file (fsspec URL, output.storage_options): read at the start of a job, "
        "updated at its end, so that the next job's controllers start warm for the same target, device and dtype. "
        "Empty: only the output's own _logs/controller_stats.json (a resumed job reads it).",
    )

"""`accelgen bench prefix=true`: whole jobs on rows that share one long prompt prefix (a system prompt,
few-shot examples), with the actors' prefix cache (`model.prefix_cache_mb`) and without it.

Why whole jobs: the cache pays across batches and units, and rows that begin alike are scheduled close
together (`workers.unit_rows.batch_order`), which only a job does. Each row is `prefix_tokens` of
text that every row shares, then `suffix_tokens` of its own (the bench's prompts, cut, cycled); the
shared text is the bench's prompts run together and cut. Each round runs, for each strategy and batch
size, a job with the cache and one with `model.prefix_cache_mb=0` (fresh processes, fresh output
folders, alternating which goes first). Prefill time is the sum of the prefills' wall time that the
target's cache counted (`prefix_cache.prefill_s` of the job's batch records, present with or without
blocks kept); whole job is the process from start to exit. The outputs of the two jobs must be
identical, row by row.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import AutoTokenizer

from jobs.bench.job import batch_records, job_overrides, run_job
from pipeline.errors import JobError
from pipeline.prompt_files import read_prompts
from workers.common.model_files import resolve_model_dir

MODES = {"cache": [], "no cache": ["model.prefix_cache_mb=0"]}


def shared_prefix_prompts(texts: list[str], tokenizer: Any, rows: int, prefix: int, suffix: int) -> list[str]:
    """`rows` prompts: one text of about `prefix` tokens, then each row's own of about `suffix`: the
    texts from its own on, run together and cut (each text tokenized alone: none is longer than a
    prompt, which a tokenizer warns of)."""
    encoded = [tokenizer.encode(text + "\n\n") for text in texts]
    shared = tokenizer.decode(_run_together(encoded, 0, prefix))
    own = [tokenizer.decode(_run_together(encoded, i, suffix)) for i in range(len(texts))]
    return [f"{shared}\n\nTask {i}: {own[i % len(own)]}" for i in range(rows)]


def _run_together(encoded: list[list[int]], first: int, tokens: int) -> list[int]:
    """The first `tokens` tokens of the texts from `first` on, cycled."""
    run: list[int] = []
    at = first
    while len(run) < tokens:  # each text holds a token at least: its "\n\n"
        run += encoded[at % len(encoded)]
        at += 1
    return run[:tokens]


def write_prompts(prompts: list[str], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": [f"p{i:05d}" for i in range(len(prompts))], "prompt": prompts})
    pq.write_table(table, folder / "prompts.parquet")
    return folder


def outputs_of(output: Path) -> dict[str, tuple[str, str]]:
    """row id -> (completion, finish reason) over a finished job's parts."""
    rows = {}
    for part in sorted(output.glob("part-*.parquet")):
        table = pq.read_table(part, columns=["row_id", "completion", "finish_reason"]).to_pylist()
        rows.update({r["row_id"]: (r["completion"], r["finish_reason"]) for r in table})
    return rows


def _one_job(overrides: list[str], output: Path) -> dict[str, Any]:
    timed = run_job(overrides, output, output.with_suffix(".log"))
    counts = [r["prefix_cache"] for r in batch_records(output) if "prefix_cache" in r]
    total = {
        key: sum(c[key] for c in counts) for key in ("prefill_s", "prompt_tokens", "cached_tokens", "forwarded_tokens")
    }
    return {"wall_s": timed.wall_s, "decode_s": timed.decode_s, **total, "rows": outputs_of(output)}


def _pair(config: Any, work: Path, input_folder: Path, strategy: str, batch_size: int) -> dict[str, Any]:
    """Both modes over `config.repeats` rounds: medians, and the most rows any job decoded otherwise than the
    first job without the cache."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    order = list(MODES)
    for round_index in range(config.repeats):
        for mode in order:
            overrides = [*job_overrides(config, input_folder, strategy, batch_size), *MODES[mode]]
            tag = f"{strategy}-b{batch_size}-r{round_index}-{mode.replace(' ', '-')}"
            runs[mode].append(_one_job(overrides, work / f"out-{tag}"))
        order.reverse()
    reference = runs["no cache"][0]["rows"]
    differ = max(sum(run["rows"].get(i) != done for i, done in reference.items()) for m in MODES for run in runs[m])
    row: dict[str, Any] = {"strategy": strategy, "batch_size": batch_size, "rows differing": differ}
    for mode in MODES:
        for key in ("wall_s", "prefill_s", "decode_s", "forwarded_tokens", "cached_tokens", "prompt_tokens"):
            row[f"{mode}: {key}"] = statistics.median(run[key] for run in runs[mode])
    row["prefill x"] = row["no cache: prefill_s"] / max(row["cache: prefill_s"], 1e-9)
    row["job x"] = row["no cache: wall_s"] / max(row["cache: wall_s"], 1e-9)
    return row


def _common_length(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['strategy']:>16} b{row['batch_size']:<3} | prefill {row['no cache: prefill_s']:7.2f} s -> "
        f"{row['cache: prefill_s']:7.2f} s ({row['prefill x']:5.2f}x) | job {row['no cache: wall_s']:7.2f} s -> "
        f"{row['cache: wall_s']:7.2f} s ({row['job x']:5.2f}x) | prompt tokens computed "
        f"{row['no cache: forwarded_tokens']:.0f} -> {row['cache: forwarded_tokens']:.0f} | rows differing "
        f"{row['rows differing']}"
    )


def main(config: Any) -> list[dict[str, Any]]:
    """`accelgen bench prefix=true` (config: `jobs.bench.settings.BenchConfig`): the rows of its table."""
    texts = read_prompts(config.prompts, config.prompt_column)
    if not texts:
        raise JobError(f"bench prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(config.model))
    prompts = shared_prefix_prompts(texts, tokenizer, config.num_prompts, config.prefix_tokens, config.suffix_tokens)
    ids = [tokenizer.encode(p) for p in prompts]
    common = min(_common_length(ids[0], t) for t in ids)
    print(
        f"{len(prompts)} rows: {statistics.mean(map(len, ids)):.0f} prompt tokens on average, the first {common} "
        f"shared by all; {config.max_new_tokens} new tokens each"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="accelgen-bench-prefix-") as tmp:
        work = Path(tmp)
        input_folder = write_prompts(prompts, work / "input")
        for batch_size in config.batch_sizes:
            for strategy in config.strategies:
                row = _pair(config, work, input_folder, strategy, batch_size)
                print_row(row)
                rows.append(row)
    for row in rows:
        print(
            f"aim: {row['strategy']} b{row['batch_size']}: prefill >= 5x lower: {row['prefill x'] >= 5}; "
            f"whole job >= 2x faster: {row['job x'] >= 2}; outputs identical: {row['rows differing'] == 0}"
        )
    return rows

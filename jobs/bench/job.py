"""`accelgen bench job=true`: whole `accelgen generate` jobs timed as a user meets them, beside peers.

Why a mode of `accelgen bench` and not a command of its own: it answers the same question (how fast
is each contender on these prompts, against transformers and our `autoregressive`) with the same
keys (prompts, strategies, batch sizes, length, repeats, transformers contenders, report); what
changes is what is timed. The in-process bench times `strategy.generate` on a loaded model; this
mode times a job from the outside.

Each of our contenders (strategy, batch size) runs as two jobs per round, each a fresh
`accelgen generate` process writing to a fresh output folder, on the same input:
- cold: the first job of the round. It pays for the interpreter, Ray, the actor, model loading and
  a controller that has learnt nothing. (The operating system's file cache cannot be dropped
  without root: after the first round the model files are in memory, as for a user's second job.)
- warm: the job right after it, in another new output folder. With `warm_cache_key` (the key of a
  cache jobs share, such as the controller's statistics), the cold job is given a new empty cache
  and the warm one the same: what a user's next job can reuse, it reuses.
Decoding is the sum of the job's batch records' `wall_s` (`_logs/batches`); everything else of the
process's wall time is "outside decoding". Rounds alternate the contenders' order; the table shows
medians and per-round ratios to the `autoregressive` job of the same batch size and mode.

Our strategies also decode in this process, interleaved with the jobs (`x bench`: a job's decode rate
over its strategy's in-process rate), on what the job decodes: its `num_prompts` rows at every batch
size (never cycled on to fill a larger batch), at the torch threads of the job's actor, an adaptive
strategy with a new controller at every pass, as a cold job's actor has.

Peers decode the same prompts in this process (transformers' `generate` and prompt lookup) or in
another virtual environment (vLLM's CPU build, `jobs/peers/vllm_offline.py`): their rate is of
decoding alone, to set beside the jobs' decode rate.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from jobs.bench.decoding import Bench, Run, Starter
from jobs.bench.job_table import LEGEND, Timed, aims, print_header, print_rows, rate_over_autoregressive, summarize
from jobs.bench.vllm_peer import VLLM_PEERS, vllm_row, vllm_runs
from jobs.shipped import default_job_config
from pipeline.config import load_config
from pipeline.errors import JobError
from pipeline.prompt_files import read_prompts
from pipeline.threads import default_torch_threads
from workers.common.model_files import local_weights_bytes
from workers.common.model_kinds import KINDS


def write_input(texts: list[str], rows: int, shards: int, folder: Path) -> Path:
    """`rows` prompts (cycled) as `shards` Parquet files of about equal size with an `id` column: the job's input."""
    if rows < 1 or shards < 1:
        raise JobError(f"bench job: num_prompts ({rows}) and job_shards ({shards}) must be >= 1")
    prompts = [texts[i % len(texts)] for i in range(rows)]
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [round(k * rows / shards) for k in range(shards + 1)]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        if b > a:
            table = pa.table({"id": [f"p{i:05d}" for i in range(a, b)], "prompt": prompts[a:b]})
            pq.write_table(table, folder / f"shard-{k:03d}.parquet")
    return folder


def batch_records(output: Path) -> list[dict[str, Any]]:
    """Every batch record of a finished job's output (`_logs/batches`)."""
    records = [
        json.loads(line)
        for path in sorted((output / "_logs" / "batches").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    if not records:
        raise JobError(f"bench job: no batch records under {output / '_logs' / 'batches'}; did the job decode?")
    return records


def decoding_of(output: Path) -> tuple[float, int]:
    """(seconds spent in batches, tokens generated) over every batch record of a finished job's output."""
    records = batch_records(output)
    return sum(r["wall_s"] for r in records), sum(r["generated_tokens"] for r in records)


def run_job(overrides: list[str], output: Path, log: Path) -> Timed:
    """One `accelgen generate` in a fresh process, timed from its start to its exit."""
    command = [sys.executable, "-m", "jobs.cli", "generate", *overrides, f"output.url={output}"]
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    wall_s = time.perf_counter() - started
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise JobError(f"bench job: `{' '.join(command)}` exited with {code}; its log {log} ends:\n{tail}")
    decode_s, tokens = decoding_of(output)
    return Timed(wall_s, decode_s, tokens)


def job_overrides(config: Any, input_folder: Path, strategy: str, batch_size: int) -> list[str]:
    """The job's keys: the bench's models, dtype and length, then `job_overrides` (which may change any of them)."""
    models = [f"model.target={config.model}", f"model.dtype={config.dtype}"]
    models.append(f"model.pack_weights={str(config.pack_weights).lower()}")
    for kind in KINDS:
        models.append(f"{kind.key}={getattr(config, kind.name) or 'null'}")
    return [
        f"input.url={input_folder}",
        "input.id_column=id",
        f"input.prompt_column={config.prompt_column}",
        *models,
        f"strategy.name={strategy}",
        f"workers.batch_size={batch_size}",
        f"generation.max_new_tokens={config.max_new_tokens}",
        "generation.ignore_eos=true",
        *config.job_overrides,
    ]


def run(
    config: Any, texts: list[str], in_process: Callable[[int], dict[str, Callable[[], Timed]]]
) -> list[dict[str, Any]]:
    """Every batch size's rows, jobs and in-process contenders interleaved by round, then vLLM's.

    `in_process(batch_size)` gives the contenders decoded in this process at that batch size (name ->
    one timed pass, warmed up)."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="accelgen-bench-job-") as tmp:
        work = Path(tmp)
        input_folder = write_input(texts, config.num_prompts, config.job_shards, work / "input")
        print_header()
        for batch_size in config.batch_sizes:
            # Each pass: the (contender, mode, timing) it measured in that round.
            passes: list[Callable[[int], list[tuple[str, str, Timed]]]] = []
            for strategy in config.strategies:
                overrides = job_overrides(config, input_folder, strategy, batch_size)
                passes.append(
                    lambda r, o=overrides, s=strategy, b=batch_size: [
                        (s, mode, t) for mode, t in _cold_then_warm(config, o, work, s, b, r)
                    ]
                )
            for name, fn in in_process(batch_size).items():
                passes.append(lambda r, f=fn, n=name: [(n, "in-process", f())])
            runs: dict[tuple[str, str], list[Timed]] = {}
            for round_index in range(config.repeats):
                for fn in passes:
                    for name, mode, timed in fn(round_index):
                        runs.setdefault((name, mode), []).append(timed)
                passes.reverse()
            done = summarize(batch_size, runs)
            print_rows(done)
            rows.extend(done)
        prompts = [texts[i % len(texts)] for i in range(config.num_prompts)]
        for method in config.vllm:
            row = vllm_row(config.num_prompts, VLLM_PEERS[method], vllm_runs(config, prompts, work, method))
            rate_over_autoregressive(row, rows)
            print_rows([row])
            rows.append(row)
    return rows


def _cold_then_warm(
    config: Any, overrides: list[str], work: Path, strategy: str, batch_size: int, round_index: int
) -> list[tuple[str, Timed]]:
    tag = f"{strategy}-b{batch_size}-r{round_index}"
    if config.warm_cache_key:  # a path not there yet: the cold job makes it, a file or a folder as the key wants
        overrides = [*overrides, f"{config.warm_cache_key}={work / f'cache-{tag}'}"]
    cold = run_job(overrides, work / f"out-{tag}-cold", work / f"{tag}-cold.log")
    if not config.warm:
        return [("cold", cold)]
    warm = run_job(overrides, work / f"out-{tag}-warm", work / f"{tag}-warm.log")
    return [("cold", cold), ("warm", warm)]


def in_process_contenders(
    bench: Bench, threads: Callable[[int], int]
) -> Callable[[int], dict[str, Callable[[], Timed]]]:
    """The in-process bench's contenders (`Bench.contenders`: transformers' and our strategies) as timed
    passes over the job's rows, each warmed up on one batch first: the `num_prompts` rows, never cycled
    on to fill a batch larger than them, as the job has no more (a batch filled beyond the job's rows
    decodes more tokens per second than the job's rows can), on the torch threads `threads(batch_size)`."""

    def contenders(batch_size: int) -> dict[str, Callable[[], Timed]]:
        count = threads(batch_size)
        torch.set_num_threads(count)
        batches = bench.batches(batch_size, fill=False)
        found = bench.contenders(batch_size)
        for start in found.values():
            start()(batches[:1])  # first calls allocate and pick kernels
        return {
            name: lambda start=start: _released(_timed(_on_threads(count, start, batches)))
            for name, start in found.items()
        }

    return contenders


def _on_threads(count: int, start: Starter, batches: list) -> Run:
    """A new pass of a contender (`start`) over `batches`, made and run on `count` torch threads: the
    passes of other batch sizes run on their own."""
    torch.set_num_threads(count)
    return start()(batches)


def _released(timed: Timed) -> Timed:
    """`timed`, once the heap memory its pass freed is handed back to the operating system (glibc's
    `malloc_trim`; nothing elsewhere). A bench process that keeps the heap its passes freed can slow
    the jobs it starts next: a job must not pay for what the bench did before it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    return timed


def _timed(run: Any) -> Timed:
    return Timed(run.wall_s, run.wall_s, sum(len(t) for t in run.tokens))


def job_torch_threads(config: Any, batch_size: int) -> int:
    """The torch threads of the bench's jobs' CPU actors at `batch_size` (`pipeline.threads` unless
    `job_overrides` set them)."""
    keys = [*job_overrides(config, Path("."), "autoregressive", batch_size), "output.url=."]  # for its workers
    job = load_config(default_job_config(), None, keys)
    target_bytes = local_weights_bytes(job.model.target)
    return job.workers.torch_threads or default_torch_threads(
        os.cpu_count() or 1, job.workers.num_actors or 1, target_bytes, job.workers.batch_size
    )


def main(config: Any) -> int:
    """`accelgen bench job=true` (config: `jobs.bench.settings.BenchConfig`)."""
    texts = read_prompts(config.prompts, config.prompt_column)
    if not texts:
        raise JobError(f"bench prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    unknown = sorted(set(config.vllm) - set(VLLM_PEERS))
    if unknown:
        raise JobError(f"vllm: unknown {unknown}; use {', '.join(VLLM_PEERS)}")
    # Jobs decode whole prompts: so does the in-process bench (no cut to max_prompt_tokens), with the
    # threads a job's actor runs at each batch size (x bench compares the job with its own code, not with
    # more threads).

    def threads(batch_size: int) -> int:
        return config.torch_threads or job_torch_threads(config, batch_size)

    # A cold job's actor starts with a controller that has learnt nothing: so does each in-process pass.
    # With one carried over from the passes before, the in-process auto would have its choices settled
    # while the cold job still explores, and x bench would compare the two unlike for like.
    bench = Bench(dataclasses.replace(config, max_prompt_tokens=sys.maxsize, new_controllers=True))
    rows = run(config, texts, in_process_contenders(bench, threads))
    print(LEGEND)
    for line in aims(rows, config.num_prompts):
        print(f"aim: {line}")
    if config.report:
        with open(config.report, "w") as f:
            json.dump(rows, f, indent=1)
    return 0

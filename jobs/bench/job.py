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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.bench.rounds import format_range, paired, per_round, spread
from jobs.shipped import default_job_config
from pipeline.config import load_config
from pipeline.errors import JobError
from pipeline.threads import default_torch_threads
from workers.common.model_kinds import KINDS

AUTOREGRESSIVE = "autoregressive"
PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "vllm_offline.py"
VLLM_PLAIN, VLLM_NGRAM = "vllm.generate", "vllm.ngram"
VLLM_PEERS = {"plain": VLLM_PLAIN, "ngram": VLLM_NGRAM}  # `vllm=[...]` -> contender
# The `auto` job's decode rate over the autoregressive job's, by batch size, and a job's decode rate over
# the same decoding in-process: what a cold job aims at (printed, never asserted).
AUTO_JOB_AIMS = ((1, 1.5), (8, 1.0), (32, 1.0))
JOB_OVER_IN_PROCESS = 0.9


@dataclass
class Timed:
    """One timed pass of a contender: a whole job, or a peer's decoding."""

    wall_s: float  # the job's process from start to exit; a peer's decoding
    decode_s: float  # the job's batches summed; a peer's decoding
    tokens: int

    @property
    def outside_s(self) -> float:
        return self.wall_s - self.decode_s

    @property
    def decode_rate(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0


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


def decoding_of(output: Path) -> tuple[float, int]:
    """(seconds spent in batches, tokens generated) over every batch record of a finished job's output."""
    records = [
        json.loads(line)
        for path in sorted((output / "_logs" / "batches").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    if not records:
        raise JobError(f"bench job: no batch records under {output / '_logs' / 'batches'}; did the job decode?")
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


def vllm_runs(config: Any, texts: list[str], work: Path, method: str) -> dict[str, Any]:
    """vLLM's offline `generate` of `texts` in the peer environment: {load_s, generate_s: [...], tokens}."""
    if not config.vllm_python:
        return {"not_measured": "give vllm_python=/path/to/venv/bin/python (README, 'Benchmarks against peers')"}
    prompts = work / "vllm_prompts.json"
    prompts.write_text(json.dumps(texts))
    result = work / f"vllm_{method}.json"
    command = [
        config.vllm_python,
        str(PEER_SCRIPT),
        f"--model={config.model}",
        f"--prompts={prompts}",
        f"--max-tokens={config.max_new_tokens}",
        f"--repeats={config.repeats}",
        f"--method={method}",
        f"--out={result}",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    log = work / f"vllm_{method}.log"
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        return {"not_measured": f"{' '.join(command)} exited with {code}: {tail.strip()[-600:]}"}
    return json.loads(result.read_text())


def summarize(batch_size: int, runs: dict[tuple[str, str], list[Timed]]) -> list[dict[str, Any]]:
    """Table rows of one batch size from each (contender, mode)'s passes: medians, per-round ratios to
    `autoregressive` in the same mode (or its cold job), and a job's decode rate over the same
    contender's in-process rate."""
    rows = []
    for (name, mode), timed in runs.items():
        reference = runs.get((AUTOREGRESSIVE, mode)) or runs.get((AUTOREGRESSIVE, "cold"))
        bench = runs.get((name, "in-process"))
        x_wall = x_decode = x_bench = decode_range = None
        if bench is not None and mode in ("cold", "warm"):
            x_bench = round(paired([t.decode_rate for t in timed], [t.decode_rate for t in bench]), 3)
        if reference is not None:
            rounds = per_round([t.decode_rate for t in timed], [t.decode_rate for t in reference])
            x_decode, decode_range = round(statistics.median(rounds), 3), spread(rounds)
            if mode in ("cold", "warm"):
                # Whole-job speed: the reference's time over ours.
                x_wall = round(paired([t.wall_s for t in reference], [t.wall_s for t in timed]), 3)
        rows.append(
            {
                "batch_size": batch_size,
                "contender": name,
                "mode": mode,
                "wall_s": round(statistics.median(t.wall_s for t in timed), 3),
                "outside_decoding_s": round(statistics.median(t.outside_s for t in timed), 3),
                "decode_s": round(statistics.median(t.decode_s for t in timed), 3),
                "decode_tokens_per_s": round(statistics.median(t.decode_rate for t in timed), 1),
                "tokens": timed[-1].tokens,
                "x_autoregressive_wall": x_wall,
                "x_autoregressive_decode": x_decode,
                "x_autoregressive_decode_range": decode_range,
                "x_in_process": x_bench,
                "passes": len(timed),
            }
        )
    return rows


def vllm_row(batch_size: int, name: str, result: dict[str, Any]) -> dict[str, Any]:
    """A row for vLLM's run: the median `generate` time (engine start-up, `load_s`, reported apart)."""
    if "not_measured" in result:
        return {"batch_size": batch_size, "contender": name, "mode": "peer", "not_measured": result["not_measured"]}
    generate_s = statistics.median(result["generate_s"])
    return {
        "batch_size": batch_size,
        "contender": name,
        "mode": "peer",
        "wall_s": round(generate_s, 3),
        "outside_decoding_s": None,
        "decode_s": round(generate_s, 3),
        "decode_tokens_per_s": round(result["tokens"] / generate_s, 1),
        "tokens": result["tokens"],
        "x_autoregressive_wall": None,
        "x_autoregressive_decode": None,
        "x_autoregressive_decode_range": None,
        "x_in_process": None,
        "engine_start_s": round(result["load_s"], 1),
        "passes": len(result["generate_s"]),
    }


def aims(rows: list[dict[str, Any]], num_prompts: int) -> list[str]:
    """The issue's aims for whole jobs, each as measured here (printed, not asserted)."""
    found = {(r["batch_size"], r["contender"], r["mode"]): r for r in rows}

    def rate(batch_size: int, contender: str, mode: str) -> float | None:
        row = found.get((batch_size, contender, mode))
        return row.get("decode_tokens_per_s") if row else None

    def verdict(measured: float | None, goal: float) -> str:
        return "not measured" if measured is None else ("met" if measured >= goal else "not met")

    lines = []
    ours, peer = rate(num_prompts, AUTOREGRESSIVE, "cold"), rate(num_prompts, VLLM_PLAIN, "peer")
    ratio = ours / peer if ours and peer else None
    lines.append(
        f"job autoregressive decode at batch {num_prompts} {_num(ours)} tok/s vs vLLM generate {_num(peer)} tok/s: "
        f"{_num(ratio, '.2f')}x (aim >= 1): {verdict(ratio, 1.0)}"
    )
    for batch_size, goal in AUTO_JOB_AIMS:
        row = found.get((batch_size, "auto", "cold"))
        x = row.get("x_autoregressive_decode") if row else None
        wall = row.get("x_autoregressive_wall") if row else None
        lines.append(
            f"auto, cold job at batch {batch_size}: decodes {_num(x, '.2f')}x the autoregressive job's rate "
            f"(whole job {_num(wall, '.2f')}x) (aim >= {goal}): {verdict(x, goal)}"
        )
    cold = [r for r in rows if r["mode"] == "cold" and r.get("x_in_process") is not None]
    lowest = min(cold, key=lambda r: r["x_in_process"], default=None)
    x = lowest["x_in_process"] if lowest else None
    where = f" ({lowest['contender']} at batch {lowest['batch_size']})" if lowest else ""
    lines.append(
        f"cold job decode over the same decoding in-process: at least {_num(x, '.2f')}x{where} "
        f"(aim >= {JOB_OVER_IN_PROCESS}): {verdict(x, JOB_OVER_IN_PROCESS)}"
    )
    ours, peer = rate(1, "prompt_lookup", "cold"), rate(1, "transformers.prompt_lookup", "in-process")
    ratio = ours / peer if ours and peer else None
    lines.append(
        f"prompt_lookup job decode at batch 1 {_num(ours)} tok/s vs transformers prompt lookup {_num(peer)} tok/s: "
        f"{_num(ratio, '.2f')}x (aim >= 1): {verdict(ratio, 1.0)}"
    )
    outside = [r["outside_decoding_s"] for r in rows if r["mode"] == "cold" and r.get("outside_decoding_s") is not None]
    worst = max(outside) if outside else None
    lines.append(
        f"time outside decoding of a {num_prompts}-row cold job: at most {_num(worst, '.1f')} s (aim <= 10 s): "
        f"{'not measured' if worst is None else ('met' if worst <= 10 else 'not met')}"
    )
    return lines


def _num(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_header() -> None:
    print(
        f"{'batch':>5}  {'contender':<28} {'mode':<10} {'wall_s':>8} {'outside':>8} {'decode/s':>9} "
        f"{'x AR job':>8} {'x AR dec':>8} {'dec range':>9} {'x bench':>7}",
        flush=True,
    )


def print_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        head = f"{r['batch_size']:>5}  {r['contender']:<28} {r['mode']:<10}"
        if "not_measured" in r:
            print(f"{head} not measured: {r['not_measured']}", flush=True)
            continue
        start = f"  engine start {r['engine_start_s']:.1f}s not counted" if "engine_start_s" in r else ""
        print(
            f"{head} {r['wall_s']:>8.2f} {_num(r['outside_decoding_s'], '.2f'):>8} {r['decode_tokens_per_s']:>9.1f} "
            f"{_num(r['x_autoregressive_wall'], '.2f'):>8} {_num(r['x_autoregressive_decode'], '.2f'):>8} "
            f"{format_range(r['x_autoregressive_decode_range']):>9} {_num(r['x_in_process'], '.2f'):>7}{start}",
            flush=True,
        )


# What the columns of `print_rows` mean, printed under the table.
LEGEND = """mode: cold = a fresh process and output folder, the first job of a round; warm = the job right after it,
  in a new output folder (sharing the cold job's cache: warm_cache_key); in-process / peer: decoding alone;
wall_s: the job's process start to exit (peers: decoding); outside: wall_s minus the batches' wall_s;
decode/s: generated tokens over the batches' wall_s; x AR job / x AR dec: per-round ratios to the
  autoregressive of the same batch size and mode (whole-job speed / decode rate), medians;
dec range: the lowest and highest of the per-round ratios behind x AR dec (a difference inside it is noise);
x bench: a job's decode rate over the same contender's in-process rate (`accelgen bench`; an adaptive
  strategy's with a new controller each pass, as a cold job's), per round"""


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
            _rate_ratio(row, rows)
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


def _rate_ratio(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """A vLLM row's decode rate over the cold autoregressive job's at the same batch size (medians)."""
    if "not_measured" in row:
        return
    key = (row["batch_size"], AUTOREGRESSIVE, "cold")
    reference = next((r for r in rows if (r["batch_size"], r["contender"], r["mode"]) == key), None)
    if reference:
        row["x_autoregressive_decode"] = round(row["decode_tokens_per_s"] / reference["decode_tokens_per_s"], 3)


def in_process_contenders(bench: Any) -> Callable[[int], dict[str, Callable[[], Timed]]]:
    """The in-process bench's contenders (`Bench.contenders`: transformers' and our strategies) as timed
    passes over the job's rows, each warmed up on one batch first: the `num_prompts` rows, never cycled
    on to fill a batch larger than them, as the job has no more (at batch 32 of 24 rows, a filled batch
    of 32 rows decodes more tokens per second than the job's 24 can)."""

    def contenders(batch_size: int) -> dict[str, Callable[[], Timed]]:
        batches = bench.batches(batch_size, fill=False)
        found = bench.contenders(batch_size)
        for fn in found.values():
            fn(batches[:1])  # first calls allocate and pick kernels
        return {name: lambda fn=fn: _released(_timed(fn(batches))) for name, fn in found.items()}

    return contenders


def _released(timed: Timed) -> Timed:
    """`timed`, once the heap memory its pass freed is handed back to the operating system (glibc's
    `malloc_trim`; nothing elsewhere). On a 2-core VM a bench process keeping the ~100 MB a pass of 24
    rows freed made the jobs it ran next decode 20-30% slower (1,100-1,500 tokens/s against 1,550-1,800
    after a trim, autoregressive at batch 32; the cause in the VM was not found): a job must not pay
    for what the bench did before it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    return timed


def _timed(run: Any) -> Timed:
    return Timed(run.wall_s, run.wall_s, sum(len(t) for t in run.tokens))


def job_torch_threads(config: Any) -> int:
    """The torch threads of the bench's jobs' CPU actors (`pipeline.threads` unless `job_overrides` set them)."""
    keys = [*job_overrides(config, Path("."), "autoregressive", 1), "output.url=."]  # read for its workers alone
    job = load_config(default_job_config(), None, keys)
    return job.workers.torch_threads or default_torch_threads(os.cpu_count() or 1, job.workers.num_actors or 1)


def main(config: Any) -> int:
    """`accelgen bench job=true` (config: `jobs.bench.decoding.BenchConfig`)."""
    from jobs.bench.decoding import Bench, read_prompts

    texts = read_prompts(config.prompts, config.prompt_column)
    if not texts:
        raise JobError(f"bench prompts {config.prompts} hold no prompts in {config.prompt_column!r}")
    unknown = sorted(set(config.vllm) - set(VLLM_PEERS))
    if unknown:
        raise JobError(f"vllm: unknown {unknown}; use {', '.join(VLLM_PEERS)}")
    # Jobs decode whole prompts: so does the in-process bench (no cut to max_prompt_tokens), with the
    # threads a job's actor runs (x bench compares the job with its own code, not with more threads).
    threads = config.torch_threads or job_torch_threads(config)
    # A cold job's actor starts with a controller that has learnt nothing: so does each in-process pass.
    # With one carried over from the passes before, the in-process auto had its choices settled while
    # the cold job explored: x bench read 0.79 at batch 1 (quiet, 24 prompts), 1.04 in the next run
    # with a new controller each pass.
    bench = Bench(
        dataclasses.replace(config, max_prompt_tokens=sys.maxsize, torch_threads=threads), controllers_carry_over=False
    )
    rows = run(config, texts, in_process_contenders(bench))
    print(LEGEND)
    for line in aims(rows, config.num_prompts):
        print(f"aim: {line}")
    if config.report:
        with open(config.report, "w") as f:
            json.dump(rows, f, indent=1)
    return 0

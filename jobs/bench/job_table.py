"""The table of `accelgen bench job=true`: each (contender, mode)'s timed passes summed up in one row, the
columns printed, and the aims for whole jobs, each as measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from jobs.bench.rounds import format_range, paired, per_round, spread
from jobs.bench.vllm_peer import VLLM_PLAIN

AUTOREGRESSIVE = "autoregressive"

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


def rate_over_autoregressive(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """A vLLM row's decode rate over the cold autoregressive job's at the same batch size (medians)."""
    if "not_measured" in row:
        return
    key = (row["batch_size"], AUTOREGRESSIVE, "cold")
    reference = next((r for r in rows if (r["batch_size"], r["contender"], r["mode"]) == key), None)
    if reference:
        row["x_autoregressive_decode"] = round(row["decode_tokens_per_s"] / reference["decode_tokens_per_s"], 3)


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

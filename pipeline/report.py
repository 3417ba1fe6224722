"""`accelgen report OUTPUT_URL`: one self-contained HTML page about a finished job.

Built from what the job leaves behind: the manifest (totals, config, parts), the committed parts
(each row's strategy, tokens and error) and the batch records under `_logs/batches/` (throughput,
speculation metrics, the controller's switches). Plots are matplotlib figures embedded as base64
PNG, so the page needs no network and no script. The series behind each plot are pure functions
of those records, tested on literal inputs; the page only draws them.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import matplotlib
import pyarrow as pa

from pipeline.commit import MANIFEST_FILE
from pipeline.errors import JobError
from pipeline.shards import parallel_map
from workers.common.output_formats import read_part_rows
from workers.common.storage import filesystem, join

matplotlib.use("Agg")  # no display: figures are only ever rendered to PNG bytes
from matplotlib import pyplot as plt  # after the backend is chosen

READ_THREADS = 16
# Records of one actor this close are one stretch of decoding (a record starts as the previous closes).
CONTIGUOUS_S = 0.05
SWITCHES_LISTED = 40  # the page's table of batch-level switches lists the first ones


@dataclass
class JobRecords:
    """What a report is built from."""

    url: str
    manifest: dict[str, Any]
    batches: list[dict[str, Any]]  # every batch record of every attempt, sorted by end time
    rows: pa.Table  # the committed rows: strategy, num_generated_tokens, finish_reason, error


def read_job(url: str, storage_options: dict[str, Any]) -> JobRecords:
    fs, root = filesystem(url, storage_options)
    root = root.rstrip("/")
    try:
        manifest = json.loads(fs.cat_file(join(root, MANIFEST_FILE)))
    except FileNotFoundError:
        raise JobError(
            f"{url} has no {MANIFEST_FILE}: the job has not finished (or this is not a job's output folder); "
            "run the job to completion first"
        ) from None
    columns = ["strategy", "num_generated_tokens", "finish_reason", "error"]
    config = manifest.get("config", {})
    output_format, samples = config.get("output", {}).get("format", "parquet"), config.get("generation", {}).get("n", 1)

    def read_part(part: dict[str, Any]) -> pa.Table:
        return read_part_rows(fs.cat_file(join(root, part["part"])), output_format, columns, samples)

    parts = parallel_map(read_part, manifest["parts"], READ_THREADS)
    logs = fs.find(join(root, "_logs", "batches")) if fs.exists(join(root, "_logs", "batches")) else []
    texts = parallel_map(lambda p: fs.cat_file(p).decode(), [p for p in logs if p.endswith(".jsonl")], READ_THREADS)
    batches = sorted((json.loads(line) for text in texts for line in text.splitlines() if line), key=_end)
    rows = pa.concat_tables(parts) if parts else pa.table({c: pa.array([], pa.string()) for c in columns})
    return JobRecords(url, manifest, batches, rows)


def _end(batch: dict[str, Any]) -> float:
    return batch.get("time", 0.0)


def throughput_by_actor(batches: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, float]]]:
    """Per actor, (start, end, tokens/s) of each batch record, in time order (seconds since the job's
    first batch began): a record's rate holds over the span it covers, whatever order the records were
    logged or read in."""
    if not batches:
        return {}
    t0 = min(_end(b) - b["wall_s"] for b in batches)
    series: dict[str, list[tuple[float, float, float]]] = {}
    for b in batches:
        if b.get("tokens_per_s") is not None:
            series.setdefault(b["actor"], []).append((_end(b) - b["wall_s"] - t0, _end(b) - t0, b["tokens_per_s"]))
    return {actor: sorted(spans) for actor, spans in series.items()}


def step_line(spans: list[tuple[float, float, float]]) -> tuple[list[float], list[float]]:
    """The line of one actor's time-ordered spans: level at each record's rate from its start to its end,
    rising or falling where the next begins as it ends, and broken (NaN) where the actor logged no
    record in between, so no stretch of the line runs back in time or claims a rate for idle time."""
    xs: list[float] = []
    ys: list[float] = []
    for start, end, rate in spans:
        last = xs[-1] if xs else math.nan
        if start - last > CONTIGUOUS_S:
            xs.append(math.nan)
            ys.append(math.nan)
            last = math.nan
        # One actor's records do not overlap, but a record's start comes from two clocks (its end's and
        # its duration's): it may lie a hair before the previous end.
        begin = start if math.isnan(last) else max(start, last)
        xs.extend((begin, max(end, begin)))
        ys.extend((rate, rate))
    return xs, ys


def tau_by_drafter(batches: list[dict[str, Any]]) -> dict[str, float]:
    """τ per drafter over the whole job: its verify steps' emitted tokens over its verify steps
    (strategies/verification/metrics.py), summed from the counts, not averaged from per-batch ratios."""
    emitted: dict[str, int] = {}
    steps: dict[str, int] = {}
    for b in batches:
        for name, n in b.get("verify_steps", {}).items():
            steps[name] = steps.get(name, 0) + n
            emitted[name] = emitted.get(name, 0) + b["verify_emitted"][name]
    return {name: emitted[name] / n for name, n in sorted(steps.items()) if n}


def acceptance_by_position(batches: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per batch strategy (`auto`: every drafter it chose), the share of verify steps reaching draft
    depth d+1 whose accepted path reached it, from the summed counts."""
    reached: dict[str, list[int]] = {}
    accepted: dict[str, list[int]] = {}
    for b in batches:
        depth = b.get("reached_depth") or []
        if not depth:
            continue
        r = reached.setdefault(b["strategy"], [])
        a = accepted.setdefault(b["strategy"], [])
        hits = b.get("accepted_at", [])
        for d, n in enumerate(depth):
            if d == len(r):
                r.append(0)
                a.append(0)
            r[d] += n
            a[d] += hits[d] if d < len(hits) else 0
    return {name: [x / n for x, n in zip(accepted[name], r, strict=True)] for name, r in sorted(reached.items())}


def timeline(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per batch: actor, start and end (seconds since the job's first batch began), the
    target forwards per option (what the controller ran; the batch's strategy where it logged none),
    its controller switches (logged at the batch's end) and fallbacks."""
    if not batches:
        return []
    t0 = min(_end(b) - b["wall_s"] for b in batches)
    return [
        {
            "actor": b["actor"],
            "start": _end(b) - b["wall_s"] - t0,
            "end": _end(b) - t0,
            "options": b.get("steps_by_drafter") or {b["strategy"]: 1},
            "switches": b.get("switches", []),
            "fallbacks": b.get("fallbacks", 0),
        }
        for b in batches
    ]


def token_share(rows: pa.Table) -> dict[str, int]:
    """Generated tokens per strategy over the committed rows (what decoded each row, after fallback)."""
    shares: dict[str, int] = {}
    for name, n in zip(
        rows.column("strategy").to_pylist(), rows.column("num_generated_tokens").to_pylist(), strict=True
    ):
        if name is not None and n:
            shares[name] = shares.get(name, 0) + n
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


def error_reason(message: str) -> str:
    """An error message with its particulars (numbers, quoted names) taken out, so rows failing for
    the same reason count together: "prompt has 230 tokens" and "prompt has 97 tokens" are one reason."""
    reason = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    return re.sub(r"\d+(\.\d+)?", "N", reason)


def errors_by_reason(rows: pa.Table) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason, message in zip(rows.column("finish_reason").to_pylist(), rows.column("error").to_pylist(), strict=True):
        if reason == "error":
            key = error_reason(message or "no message")
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def totals(job: JobRecords) -> list[tuple[str, str]]:
    """The job's totals as (label, value) rows."""
    m, s = job.manifest, job.manifest.get("summary", {})
    config = m.get("config", {})
    generated = sum(n or 0 for n in job.rows.column("num_generated_tokens").to_pylist())
    decode_s = sum(b["wall_s"] for b in job.batches)
    rows = [
        ("output", job.url),
        ("job fingerprint", m.get("fingerprint", "")[:12]),
        ("rows", f"{m.get('total_rows', job.rows.num_rows)} in {len(m['parts'])} parts"),
        ("error rows", str(sum(errors_by_reason(job.rows).values()))),
        ("generated tokens", str(generated)),
        ("batches logged (all attempts)", str(len(job.batches))),
        ("decode time in batches", f"{decode_s:.1f} s ({generated / decode_s:.1f} tokens/s)" if decode_s else "—"),
        ("last run: wall time", f"{s.get('wall_s', 0):.1f} s ({s.get('tokens_per_s') or 0:.1f} tokens/s)"),
        ("model", str(config.get("model", {}).get("target", ""))),
        ("strategy", str(config.get("strategy", {}).get("name", ""))),
        ("lossy strategies", ", ".join(m.get("lossy", {})) or "none: every row is the target's own output"),
    ]
    if job.batches:
        first = min(_end(b) - b["wall_s"] for b in job.batches)
        rows.append(("first batch began", datetime.fromtimestamp(first, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")))
    return rows


def render(job: JobRecords) -> str:
    """The report page: totals, then one figure per question, each a base64 PNG."""
    sections = [
        ("Tokens/s over time, per actor", _throughput_figure(job.batches)),
        ("τ by drafter and acceptance by draft position", _speculation_figure(job.batches)),
        ("Batches, controller switches and fallbacks over time", _timeline_figure(job.batches)),
        ("Share of generated tokens per strategy", _share_figure(token_share(job.rows))),
        ("Error rows by reason", _errors_figure(errors_by_reason(job.rows))),
    ]
    body = [f"<h1>accelgen job report</h1>{_table(totals(job))}"]
    for title, png in sections:
        body.append(f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{png}">')
    body.append(f"<h2>Batch-level controller switches</h2>{_switches_table(job.batches)}")
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "img{max-width:100%}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>accelgen report</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_report(url: str, storage_options: dict[str, Any], out_path: str) -> str:
    page = render(read_job(url, storage_options))
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(page)
    return out_path


def _table(rows: list[tuple[str, str]], header: tuple[str, ...] = ()) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{cells}</table>"


def _switches_table(batches: list[dict[str, Any]]) -> str:
    events = [(e, b["actor"]) for b in batches for e in b.get("switches", []) if e.get("scope") == "batch"]
    if not events:
        return "<p>No batch-level switches.</p>"
    rows = [(actor, e["from"], e["to"], e["reason"]) for e, actor in events[:SWITCHES_LISTED]]
    more = f"<p>… and {len(events) - SWITCHES_LISTED} more.</p>" if len(events) > SWITCHES_LISTED else ""
    return _table(rows, ("actor", "from", "to", "reason")) + more


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _nothing(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _throughput_figure(batches: list[dict[str, Any]]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    series = throughput_by_actor(batches)
    for actor, spans in sorted(series.items()):
        ax.plot(*step_line(spans), label=actor)
    if series:
        ax.set_xlabel("seconds since the first batch began (each record's rate over the time it covers)")
        ax.set_ylabel("tokens/s of the batch record")
        ax.legend(loc="best", fontsize="small")
        ax.grid(alpha=0.3)
    else:
        _nothing(ax, "no batch records")
    return _png(fig)


def _speculation_figure(batches: list[dict[str, Any]]) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    taus = tau_by_drafter(batches)
    if taus:
        left.bar(list(taus), list(taus.values()), color="#4c72b0")
        left.axhline(1.0, color="#999", linewidth=1, linestyle="--")
        left.set_ylabel("τ: tokens per verify step")
        left.tick_params(axis="x", labelrotation=30)
    else:
        _nothing(left, "no verify steps (no drafter ran)")
    curves = acceptance_by_position(batches)
    for name, shares in curves.items():
        right.plot(range(1, len(shares) + 1), shares, marker="o", label=name)
    if curves:
        right.set_xlabel("draft position (depth)")
        right.set_ylabel("acceptance")
        right.set_ylim(0, 1.05)
        right.legend(loc="best", fontsize="small", title="batch strategy")
        right.grid(alpha=0.3)
    else:
        _nothing(right, "no drafts")
    fig.tight_layout()
    return _png(fig)


def _timeline_figure(batches: list[dict[str, Any]]) -> str:
    spans = timeline(batches)
    actors = sorted({s["actor"] for s in spans})
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.8 * max(1, len(actors))))
    if not spans:
        _nothing(ax, "no batch records")
        return _png(fig)
    names = sorted({name for s in spans for name in s["options"]})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    for s in spans:
        lane, start = actors.index(s["actor"]), s["start"]
        forwards = sum(s["options"].values())
        for name, n in sorted(s["options"].items()):
            width = (s["end"] - s["start"]) * n / forwards
            ax.broken_barh([(start, width)], (lane - 0.3, 0.6), color=colours[name])
            start += width
        ax.broken_barh([(s["start"], s["end"] - s["start"])], (lane - 0.3, 0.6), facecolor="none", edgecolor="white")
    legend = [plt.Rectangle((0, 0), 1, 1, color=colours[n], label=n) for n in names]
    marks = (
        ("batch switches", "o", "black", lambda s: sum(e.get("scope") == "batch" for e in s["switches"])),
        ("rows turned to plain", "x", "#dd8452", lambda s: sum(e.get("scope") == "row" for e in s["switches"])),
        ("fallbacks", "v", "#c44e52", lambda s: s["fallbacks"]),
    )
    for offset, (label, marker, colour, count) in zip((0.38, 0.45, 0.52), marks, strict=True):
        points = [(s["end"], actors.index(s["actor"]) + offset, count(s)) for s in spans if count(s)]
        if points:
            sizes = [12 + 6 * min(n, 20) for _, _, n in points]
            handle = ax.scatter([p[0] for p in points], [p[1] for p in points], s=sizes, marker=marker, color=colour)
            handle.set_label(f"{label} ({sum(n for _, _, n in points)})")
            legend.append(handle)
    ax.set_yticks(range(len(actors)), actors)
    ax.set_ylim(-0.6, len(actors) - 0.3)
    ax.set_xlabel(
        "seconds since the first batch began (a bar per batch, split by its target forwards per option; "
        "marks at the batch's end)"
    )
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return _png(fig)


def _share_figure(shares: dict[str, int]) -> str:
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.45 * max(1, len(shares))))
    total = sum(shares.values())
    if shares:
        names = list(reversed(shares))
        ax.barh(names, [shares[n] for n in names], color="#55a868")
        for i, n in enumerate(names):
            ax.text(shares[n], i, f" {shares[n]} ({100 * shares[n] / total:.1f}%)", va="center", fontsize="small")
        ax.set_xlabel("generated tokens of the committed rows")
        ax.set_xlim(0, max(shares.values()) * 1.25)
    else:
        _nothing(ax, "no generated tokens")
    return _png(fig)


def _errors_figure(reasons: dict[str, int]) -> str:
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.45 * max(1, len(reasons))))
    if reasons:
        labels = list(reversed(reasons))
        ax.barh([_shorten(r) for r in labels], [reasons[r] for r in labels], color="#c44e52")
        ax.set_xlabel("error rows")
        ax.xaxis.get_major_locator().set_params(integer=True)
    else:
        _nothing(ax, "no error rows")
    return _png(fig)


def _shorten(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"

"""The controller statistics file: what actors' controllers learned, kept for the next job.

One small JSON file holds, per (target weights hash, device, dtype), what the controllers of a job
learned (`strategies.control.controller.Learned`): step times by batch bucket, τ by drafter (and by batch bucket
and node budget, and a tree drafter's by node budget), draft sizes, and the
cost model's measurements (forward times by batch bucket and width, each drafter's host time). The
driver writes it at the end of a job to the output's `_logs/controller_stats.json` and, when
`workers.controller_stats_url` is set, into that shared file (entries of other keys kept); it reads
it at the start of the next job (the shared file, else the output's own from an earlier run) and
hands it to the actors in their `WorkerSpec`; each actor warm-starts its controller from the entry of
its own key and ignores the others (docs/design.md, "The adaptive controller").

A file that cannot be read, is not JSON, or has another schema is ignored with a warning naming it:
statistics only save exploration, they never decide a token. A file of an earlier schema
(`accelgen.controller_stats/1`, before the cost model; `/2`, whose drafters' step times, wide
forwards and host times were seconds, not ratios to a plain step) is read with its plain step times,
τ and sizes only: the controller measures the rest from its first steps. One of `/3`, which kept one τ
per drafter, is read with its times too, and τ by bucket and budget is measured afresh.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

from strategies.control.controller import Learned
from strategies.verification.control import AUTOREGRESSIVE
from workers.common.storage import filesystem, join, write_bytes

SCHEMA = "accelgen.controller_stats/4"
# /1 lacks forward_time and host_time; /2 kept them and drafters' step times in seconds, and host times
# by drafter and bucket only: both are read without them.
WITHOUT_COSTS = ("accelgen.controller_stats/1", "accelgen.controller_stats/2")
# /3 lacks tau_at and tree_tau (τ by batch bucket and node budget): read with one τ per drafter.
WITHOUT_SIZED_TAU = ("accelgen.controller_stats/3", *WITHOUT_COSTS)
READABLE = (SCHEMA, *WITHOUT_SIZED_TAU)
FILE_NAME = "controller_stats.json"  # in the output's _logs/


@dataclass(frozen=True)
class StatsKey:
    """Whose statistics: step costs and acceptance hold for one target, device and dtype."""

    target: str  # the target's weights hash (`_job.json` identity.model.weights_sha256.target)
    device: str  # `workers.warm_up.device_identity`
    dtype: str  # torch dtype name, e.g. float32


def logs_url(output_url: str) -> str:
    """Where a job's statistics lie in its output folder."""
    return join(output_url, "_logs", FILE_NAME)


def encode(stats: dict[StatsKey, Learned]) -> dict[str, Any]:
    """The file's JSON document."""
    entries = []
    for key, learned in sorted(stats.items(), key=lambda item: (item[0].target, item[0].device, item[0].dtype)):
        entries.append(
            {
                "target": key.target,
                "device": key.device,
                "dtype": key.dtype,
                "row_time": [
                    {"option": option, "bucket": b, "recent": recent, "count": count}
                    for (option, b), (recent, count) in sorted(learned.row_time.items())
                ],
                "tau": {name: {"value": v, "seen": seen} for name, (v, seen) in sorted(learned.tau.items())},
                "measured": {
                    name: {"steps": st, "rows": rows} for name, (st, rows) in sorted(learned.measured.items())
                },
                "depth": dict(sorted(learned.depth.items())),
                "nodes": dict(sorted(learned.nodes.items())),
                "forward_time": [
                    {"bucket": b, "width": width, "recent": recent, "count": count}
                    for (b, width), (recent, count) in sorted(learned.forward_time.items())
                ],
                "host_time": [
                    {"drafter": name, "bucket": b, "width": width, "recent": recent, "count": count}
                    for (name, b, width), (recent, count) in sorted(learned.host_time.items())
                ],
                "tau_at": [
                    {"drafter": name, "bucket": b, "budget": budget, "value": v, "seen": seen}
                    for (name, b, budget), (v, seen) in sorted(learned.tau_at.items())
                ],
                "tree_tau": [
                    {"drafter": name, "budget": budget, "value": v, "seen": seen}
                    for (name, budget), (v, seen) in sorted(learned.tree_tau.items())
                ],
            }
        )
    return {"schema": SCHEMA, "entries": entries}


def decode(document: Any) -> dict[StatsKey, Learned]:
    """The statistics of a file's JSON document; ValueError saying what is wrong with it."""
    if not isinstance(document, dict) or document.get("schema") not in READABLE:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise ValueError(f"schema {found!r} is not one of {', '.join(map(repr, READABLE))}")
    entries = document.get("entries")
    if not isinstance(entries, list):
        raise ValueError("it has no list of entries")
    stats = {}
    costs = document["schema"] not in WITHOUT_COSTS
    sized_tau = document["schema"] not in WITHOUT_SIZED_TAU
    for i, entry in enumerate(entries):
        try:
            key, learned = _entry(entry, costs, sized_tau)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"entry {i} is malformed ({type(exc).__name__}: {exc})") from None
        stats[key] = learned
    return stats


def _entry(entry: dict[str, Any], costs: bool, sized_tau: bool) -> tuple[StatsKey, Learned]:
    """One entry; `costs`: with its drafters' step times and its forward and host times (`WITHOUT_COSTS`);
    `sized_tau`: with τ by batch bucket and node budget (`WITHOUT_SIZED_TAU`)."""
    key = StatsKey(_text(entry["target"]), _text(entry["device"]), _text(entry["dtype"]))
    row_time = {
        (_text(t["option"]), _count(t["bucket"])): _times(t, "option")
        for t in entry["row_time"]
        if costs or t["option"] == AUTOREGRESSIVE
    }
    forward_time = {
        (_count(t["bucket"]), _count(t["width"])): _times(t, "width") for t in (entry["forward_time"] if costs else [])
    }
    host_time = {
        (_text(t["drafter"]), _count(t["bucket"]), _count(t["width"])): _times(t, "drafter")
        for t in (entry["host_time"] if costs else [])
    }
    return key, Learned(
        row_time=row_time,
        tau={_text(n): (_seconds(t["value"]), _seconds(t["seen"])) for n, t in entry["tau"].items()},
        measured={_text(n): (_count(m["steps"]), _count(m["rows"])) for n, m in entry["measured"].items()},
        depth={_text(n): _count(d) for n, d in entry["depth"].items()},
        nodes={_text(n): _count(d) for n, d in entry["nodes"].items()},
        forward_time=forward_time,
        host_time=host_time,
        tau_at={
            (_text(t["drafter"]), _count(t["bucket"]), _count(t["budget"])): (_seconds(t["value"]), _seconds(t["seen"]))
            for t in (entry["tau_at"] if sized_tau else [])
        },
        tree_tau={
            (_text(t["drafter"]), _count(t["budget"])): (_seconds(t["value"]), _seconds(t["seen"]))
            for t in (entry["tree_tau"] if sized_tau else [])
        },
    )


def _times(t: dict[str, Any], name: str) -> tuple[list[float], int]:
    """Recent measurements and their count; `name` is the field that names them in an error."""
    recent = [_seconds(x) for x in t["recent"]]
    if not recent:
        raise TypeError(f"times of {name} {t[name]!r} hold no measurement")
    return recent, _count(t["count"])


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{x!r} is not a string")
    return x


def _count(x: Any) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise TypeError(f"{x!r} is not a count")
    return x


def _seconds(x: Any) -> float:
    if not isinstance(x, int | float) or isinstance(x, bool) or not 0 <= x < float("inf"):
        raise TypeError(f"{x!r} is not a non-negative number")
    return float(x)


def read(url: str, storage_options: dict[str, Any]) -> dict[StatsKey, Learned]:
    """The statistics at `url`; none if there is no file yet, or (with a warning naming the file) if it
    cannot be used: a job never fails on its statistics."""
    try:
        fs, path = filesystem(url, storage_options)
        data = fs.cat_file(path)
    except FileNotFoundError:
        return {}
    except Exception as exc:
        warnings.warn(f"controller statistics {url} ignored: cannot read it ({exc})", stacklevel=2)
        return {}
    try:
        return decode(json.loads(data))
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError included
        warnings.warn(
            f"controller statistics {url} ignored: {exc}; the job explores on its own and rewrites it at its end",
            stacklevel=2,
        )
        return {}


def write(url: str, storage_options: dict[str, Any], stats: dict[StatsKey, Learned]) -> None:
    write_bytes(*filesystem(url, storage_options), (json.dumps(encode(stats), indent=1) + "\n").encode())


def merge(learned: list[Learned]) -> Learned:
    """One actor's statistics from several of one key: per option (and batch bucket), and per forward
    width or drafter's host time, those of the actor that measured it most; τ (every one kept of a
    drafter) and draft sizes with the drafter's measurements."""
    merged = Learned()
    for one in learned:
        for times, merged_times in (
            (one.row_time, merged.row_time),
            (one.forward_time, merged.forward_time),
            (one.host_time, merged.host_time),
        ):
            for key, (recent, count) in times.items():
                if count > merged_times.get(key, ([], -1))[1]:
                    merged_times[key] = (recent, count)
        for name, (steps, rows) in one.measured.items():
            if rows > merged.measured.get(name, (0, -1))[1]:
                merged.measured[name] = (steps, rows)
                for source, target in ((one.tau, merged.tau), (one.depth, merged.depth), (one.nodes, merged.nodes)):
                    if name in source:
                        target[name] = source[name]
                for source, target in ((one.tau_at, merged.tau_at), (one.tree_tau, merged.tree_tau)):
                    for key in [key for key in target if key[0] == name]:
                        del target[key]
                    target.update({key: value for key, value in source.items() if key[0] == name})
    return merged


def for_job(shared_url: str | None, output_url: str, storage_options: dict[str, Any]) -> dict[StatsKey, Learned]:
    """What the job's actors warm-start from: the shared file, else the output's own (a resumed job)."""
    return (read(shared_url, storage_options) if shared_url else {}) or read(logs_url(output_url), storage_options)


def save_job(
    shared_url: str | None, output_url: str, storage_options: dict[str, Any], learned: dict[StatsKey, list[Learned]]
) -> None:
    """Write the job's statistics (its actors' merged by key) to the output's `_logs/` and into the
    shared file, whose other keys stay (last writer wins: it is a cache). A job whose controllers
    measured nothing (plain decoding only) writes nothing."""
    merged = {key: merge(values) for key, values in learned.items()}
    job = {key: one for key, one in merged.items() if one.row_time}
    if not job:
        return
    write(logs_url(output_url), storage_options, job)
    if shared_url:
        write(shared_url, storage_options, {**read(shared_url, storage_options), **job})

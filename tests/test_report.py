"""`accelgen report`: the series behind each plot on literal records, and a real job's page in headless Chromium."""

from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from matplotlib.image import imread

from jobs.cli import main as cli
from pipeline.report import (
    acceptance_by_position,
    error_reason,
    errors_by_reason,
    read_job,
    step_line,
    tau_by_drafter,
    throughput_by_actor,
    timeline,
    token_share,
)

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def _batch(actor: str, end: float, wall_s: float, **fields) -> dict:
    return {"actor": actor, "time": end, "wall_s": wall_s, "strategy": "speculative", "tokens_per_s": 10.0, **fields}


def test_tau_and_acceptance_are_summed_from_counts_not_averaged_from_ratios():
    batches = [
        _batch(
            "a",
            1.0,
            1.0,
            verify_steps={"draft": 10},
            verify_emitted={"draft": 30},
            reached_depth=[10, 4],
            accepted_at=[5, 1],
        ),
        _batch(
            "a",
            2.0,
            1.0,
            verify_steps={"draft": 2, "lookup": 4},
            verify_emitted={"draft": 2, "lookup": 6},
            reached_depth=[2, 2, 2],
            accepted_at=[1],
        ),
        _batch("a", 3.0, 1.0, strategy="autoregressive"),
    ]
    assert tau_by_drafter(batches) == {"draft": 32 / 12, "lookup": 1.5}
    assert acceptance_by_position(batches) == {"speculative": [6 / 12, 1 / 6, 0.0]}


def test_throughput_and_timeline_count_from_the_first_batch_start():
    batches = [
        _batch(
            "a",
            105.0,
            2.0,
            switches=[{"scope": "batch", "from": "x", "to": "y", "reason": "r"}],
            fallbacks=3,
            steps_by_drafter={"autoregressive": 3, "x": 1},
        ),
        _batch("b", 104.0, 3.0, tokens_per_s=None),
    ]
    assert throughput_by_actor(batches) == {"a": [(2.0, 4.0, 10.0)]}
    spans = timeline(batches)
    assert [(s["actor"], s["start"], s["end"], s["fallbacks"]) for s in spans] == [
        ("a", 2.0, 4.0, 3),
        ("b", 0.0, 3.0, 0),
    ]
    assert spans[1]["options"] == {"speculative": 1}
    assert spans[0]["switches"][0]["to"] == "y" and spans[0]["options"] == {"autoregressive": 3, "x": 1}


def _runs_forward(xs: list[float]) -> bool:
    """Whether every stretch of a line (between NaN breaks) runs forward in time."""
    return all(b >= a for a, b in itertools.pairwise(xs) if not (math.isnan(a) or math.isnan(b)))


def test_throughput_is_each_actors_records_in_time_order_as_steps():
    logged = [  # out of time order, as attempts and units log them
        _batch("a", 110.0, 4.0, tokens_per_s=30.0),
        _batch("b", 105.0, 5.0, tokens_per_s=8.0),
        _batch("a", 104.0, 4.0),
        _batch("a", 106.0, 2.0, tokens_per_s=20.0),
        _batch("a", 118.0, 2.0, tokens_per_s=40.0),  # after 6 s without a record
    ]
    series = throughput_by_actor(logged)
    assert series == {
        "a": [(0.0, 4.0, 10.0), (4.0, 6.0, 20.0), (6.0, 10.0, 30.0), (16.0, 18.0, 40.0)],
        "b": [(0.0, 5.0, 8.0)],
    }
    xs, ys = step_line(series["a"])
    assert xs[:6] == [0.0, 4.0, 4.0, 6.0, 6.0, 10.0] and ys[:6] == [10.0, 10.0, 20.0, 20.0, 30.0, 30.0]
    assert math.isnan(xs[6]) and math.isnan(ys[6])  # no line across the time no record covers
    assert xs[7:] == [16.0, 18.0] and ys[7:] == [40.0, 40.0]
    # A start a hair before the previous end (two clocks) does not step back.
    assert step_line([(0.0, 1.0, 5.0), (0.999, 2.0, 6.0)])[0] == [0.0, 1.0, 1.0, 2.0]


def test_rows_count_tokens_per_strategy_and_errors_per_reason():
    rows = pa.table(
        {
            "strategy": ["speculative", "autoregressive", "speculative", None, None, None],
            "num_generated_tokens": [5, 3, 4, None, None, None],
            "finish_reason": ["length", "stop", "length", "error", "error", "error"],
            "error": [
                None,
                None,
                None,
                "prompt has 230 tokens and the model's context is 96",
                "prompt is null",
                "prompt has 97 tokens and the model's context is 96",
            ],
        }
    )
    assert token_share(rows) == {"speculative": 9, "autoregressive": 3}
    assert errors_by_reason(rows) == {"prompt has N tokens and the model's context is N": 2, "prompt is null": 1}
    assert (
        error_reason("strategy: unknown strategy 'fast' (known: a, b)")
        == "strategy: unknown strategy '…' (known: a, b)"
    )


def _screenshot(page: Path, png: Path) -> list[str]:
    """Render `page` in headless Chromium into `png`; the console messages it logged."""
    run = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,2600",
            f"--screenshot={png}",
            "--enable-logging=stderr",
            "--v=0",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.is_file(), run.stderr[-2000:]
    return [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(
    BROWSER is None,
    reason="no chromium on PATH: `make browser` (.ci/install-browser) installs "
    "Debian's chromium where the machine allows (root or sudo, with apt-get)",
)
def test_a_real_jobs_report_renders_in_a_browser(tmp_path, tiny_model_dir, tiny_draft_dir):
    prompts = ["def add(a, b):", "import os\n", "for i in range(10):", "class Stack:", None, "", "x " * 200]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in.parquet", row_group_size=4)
    args = [
        f"input.url={tmp_path / 'in.parquet'}",
        f"output.url={tmp_path / 'out'}",
        f"model.target={tiny_model_dir}",
        f"model.draft={tiny_draft_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
        "model.eagle=null",
        "strategy.name=speculative",
        # The strategy itself, not its controller: a 10-token job is too short for the exploration budget.
        "strategy.adaptive=false",
        "input.rows_per_unit=4",
        "workers.batch_size=2",
        "generation.max_new_tokens=10",
    ]
    assert cli(["generate", *args]) == 0
    assert cli(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()

    job = read_job(str(tmp_path / "out"), {})
    assert errors_by_reason(job.rows) == {
        "prompt is null": 1,
        "prompt is empty or whitespace only": 1,
        "prompt has N tokens and the model's context is N, leaving no room to generate: shorten the prompt or use a "
        "model with a longer context": 1,
    }
    assert sum(token_share(job.rows).values()) == sum(
        n or 0 for n in job.rows.column("num_generated_tokens").to_pylist()
    )
    generated = sum(n or 0 for n in job.rows.column("num_generated_tokens").to_pylist())
    assert sum(b["generated_tokens"] for b in job.batches) == generated  # the records cover the decoding
    # The tokens/s picture: each actor's line runs forward in time, over every record of the actor.
    for actor, spans in throughput_by_actor(job.batches).items():
        xs, _ = step_line(spans)
        assert _runs_forward(xs), (actor, xs)
        assert len(spans) == sum(b["actor"] == actor and b["tokens_per_s"] is not None for b in job.batches)
    assert set(tau_by_drafter(job.batches)) == {"speculative"}
    # Self-contained: five embedded plots and nothing fetched from anywhere.
    assert page.count('src="data:image/png;base64,') == 5
    assert re.findall(r'(?:src|href)="(?!data:)', page) == []
    assert "<td>error rows</td><td>3</td>" in page

    console = _screenshot(tmp_path / "report.html", tmp_path / "report.png")
    assert console == []
    pixels = imread(tmp_path / "report.png")[..., :3]  # [H, W, 3] in [0, 1]
    ink = (pixels.min(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    colours = len(np.unique((pixels[::4, ::4] * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert ink > 0.03 and colours > 50, (ink, colours)

    # The console check can fail: a page with a script error is caught.
    (tmp_path / "broken.html").write_text("<html><body><script>notDefined()</script></body></html>")
    assert any("notDefined" in line for line in _screenshot(tmp_path / "broken.html", tmp_path / "broken.png"))

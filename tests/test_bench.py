"""`accelgen bench`: its speed-up is a median of per-round ratios, robust to the machine's drift, and
it runs end to end on a tiny model."""

from __future__ import annotations

import json

import pytest

from jobs.bench import HF_GENERATE, paired_speedup
from jobs.cli import main as cli


def test_paired_speedup_follows_each_round_and_drops_an_outlier():
    # The machine slows down by half in rounds 3-4; the contender is 1.25x faster in every round.
    reference = [1.0, 1.0, 2.0, 2.0, 1.0]
    contender = [0.8, 0.8, 1.6, 1.6, 3.0]  # round 5: a pause hit the contender
    assert paired_speedup(reference, contender) == pytest.approx(1.25)


def test_bench_times_every_contender_on_a_tiny_model(tmp_path, tiny_model_dir, tiny_draft_dir, capsys):
    """`accelgen bench` end to end: in float64 every lossless contender yields generate's greedy rows."""
    prompts = ["def add(a, b):", "import os\nimport sys\n", "for i in range(10):"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    report = tmp_path / "report.json"
    args = [
        f"model={tiny_model_dir}",
        f"draft={tiny_draft_dir}",
        f"prompts={tmp_path / 'prompts.jsonl'}",
        "num_prompts=3",
        "dtype=float64",
        "strategies=[autoregressive,speculative,prompt_lookup]",
        "strategy.num_speculative_tokens=3",
        "batch_sizes=[1,2]",
        "max_new_tokens=12",
        "repeats=1",
        f"report={report}",
    ]
    assert cli(["bench", *args]) == 0
    rows = {(r["batch_size"], r["contender"]): r for r in json.loads(report.read_text())}
    contenders = [HF_GENERATE, "autoregressive", "speculative", "prompt_lookup"]
    assert list(rows) == [(b, c) for b in (1, 2) for c in contenders]
    for (batch_size, name), row in rows.items():
        assert row["rows_equal_to_generate"] == 1.0, (batch_size, name)
        # Three prompts (cycled to fill a batch) of 12 tokens each, over the median wall time.
        assert row["tokens_per_s"] * row["median_wall_s"] == pytest.approx(3 * 12, rel=0.01)
        if name in (HF_GENERATE, "autoregressive"):
            assert row["tau"] is None and row["acceptance_by_position"] == []
        else:
            assert 1.0 <= row["tau"] <= 4.0 and 1 <= len(row["acceptance_by_position"]) <= 3
    assert rows[(1, "autoregressive")]["x_autoregressive"] == 1.0 and rows[(2, HF_GENERATE)]["x_generate"] == 1.0
    table = capsys.readouterr().out
    assert all(f"{b:>5}  {c:<28}" in table for b, c in rows)

"""`accelgen bench costs=true`: the forward grid, the plain step and each drafting step by phase."""

from __future__ import annotations

import json
import time

import pytest
import torch

from jobs.bench import costs
from jobs.cli import main as cli
from strategies.runtime import kv_cache
from strategies.runtime.runner import ModelRunner
from strategies.verification import speculative
from strategies.verification import verify as verifier


def test_cache_rows_are_exactly_the_asked_length_and_differ_by_row():
    rows = costs.cache_rows([[1, 2, 3], [4, 5]], batch_size=3, cache_tokens=4)
    assert rows == [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 1]]


def test_forward_flops_counts_every_linear_once_per_token_and_attention_over_the_context():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(4, 8, bias=False)  # 32 weights
            self.head = torch.nn.Linear(8, 10, bias=False)  # 80 weights
            self.config = type("C", (), {"num_hidden_layers": 2, "hidden_size": 4})()

    # Per token: 2 * 112 for the linears, 4 * 2 layers * 4 wide * (5 cached + 3 new) for attention.
    assert costs.forward_flops(Tiny(), batch=2, new_tokens=3, context=5) == 2 * 3 * (2 * 112 + 4 * 2 * 4 * 8)


def test_cost_table_on_a_tiny_model_and_the_loop_left_as_it_was(tmp_path, tiny_model_dir, tiny_draft_dir, capsys):
    """Every phase is inside the step it splits (bookkeeping is what is left, never negative), every
    strategy drafted, and the wrapped collaborators are the originals again afterwards."""
    prompts = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    report = tmp_path / "costs.json"
    originals = (speculative.verify, verifier.verify_inputs, kv_cache.RaggedKV.invalidate, ModelRunner.forward)
    args = [
        f"model={tiny_model_dir}",
        f"draft={tiny_draft_dir}",
        f"prompts={tmp_path / 'prompts.jsonl'}",
        "num_prompts=2",
        "dtype=float64",
        "costs=true",
        "strategies=[autoregressive,speculative,prompt_lookup]",
        "batch_sizes=[1,2]",
        "cost_new_tokens=[1,4]",
        "cost_cache_tokens=16",
        "max_new_tokens=10",
        "repeats=1",
        f"report={report}",
    ]
    assert cli(["bench", *args]) == 0
    table = json.loads(report.read_text())
    assert [b["batch_size"] for b in table["batches"]] == [1, 2]
    for entry in table["batches"]:
        assert [f["new_tokens"] for f in entry["forwards"]] == [1, 4]
        assert all(f["forward_ms"] > 0 and f["bound_ms"] > 0 for f in entry["forwards"])
        assert entry["plain_step_ms"] > 0
        assert entry["rows"] == 2  # every prompt, at batch 1 too: not the first batch alone
        assert [d["strategy"] for d in entry["drafters"]] == ["speculative", "prompt_lookup"]
        for d in entry["drafters"]:
            assert d["drafting_steps"] > 0 and d["tau"] >= 1.0
            ms = d["ms"]
            assert ms["forward"] > 0 and ms["bookkeeping"] >= 0
            assert sum(ms[p] for p in costs.PHASES) == pytest.approx(ms["step"], abs=0.01)
        assert entry["drafters"][0]["ms"]["propose"] > 0  # the draft model's forwards
    assert (speculative.verify, verifier.verify_inputs, kv_cache.RaggedKV.invalidate, ModelRunner.forward) == originals
    assert "plain step" in capsys.readouterr().out


def test_the_cost_table_times_each_batch_size_after_the_runner_warmed_up_for_it(tmp_path, tiny_model_dir, monkeypatch):
    """Packing is chosen per row count as a runner warms up: a table timed before it would time
    matmuls a job does not run."""
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    events = []
    warm_up, cache_rows = ModelRunner.warm_up, costs.cache_rows

    def warming(self, batch_size):
        events.append(("warm_up", batch_size))
        return warm_up(self, batch_size)

    def grid_rows(prompts, batch_size, cache_tokens):  # the rows of the timed forward grid
        events.append(("forwards", batch_size))
        return cache_rows(prompts, batch_size, cache_tokens)

    monkeypatch.setattr(ModelRunner, "warm_up", warming)
    monkeypatch.setattr(costs, "cache_rows", grid_rows)
    args = [f"model={tiny_model_dir}", f"prompts={tmp_path / 'prompts.jsonl'}", "num_prompts=1", "costs=true"]
    args += ["strategies=[autoregressive]", "batch_sizes=[1,2]", "cost_new_tokens=[1]", "cost_cache_tokens=8"]
    assert cli(["bench", *args, "max_new_tokens=4", "repeats=1", f"report={tmp_path / 'costs.json'}"]) == 0
    assert events == [("warm_up", 1), ("forwards", 1), ("warm_up", 2), ("forwards", 2)]


def test_a_drafters_ceiling_is_its_speed_with_the_target_forward_alone():
    """τ 3 at a 2 ms plain step: a 5 ms step of which 4 ms is the forward gives 1.2x, and no cut of its
    1 ms of host work takes it past 3 × 2 / 4 = 1.5x."""
    phases = {"propose": 0.0005, "verify_inputs": 0.0, "forward": 0.004, "accept": 0.0005, "rollback": 0.0}
    run = {"drafting_steps": 1, "tau": 3.0, "totals_s": {**phases, "bookkeeping": 0.0, "step": 0.005}}
    row = costs._drafter_row("lookup", [run], plain_ms=2.0)
    assert row["x_plain"] == pytest.approx(1.2)
    assert row["x_ceiling"] == pytest.approx(1.5)
    assert row["host_over_plain"] == pytest.approx(0.5)


def test_the_plain_step_is_one_decode_step_of_the_batch_at_hand(tmp_path, tiny_model_dir, monkeypatch):
    """A target whose every step's forward takes 100 ms more, and every prefill 500 ms more: the plain
    step comes out at about one such step, at every batch size and however many prompts the table
    decodes, never a multiple of it nor a share of the prefills."""
    prompts = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    forward, step_s, prefill_s = ModelRunner.forward, 0.1, 0.5

    def slowed(self, kv, input_ids, *args, **kwargs):
        time.sleep(step_s if input_ids.shape[1] == 1 else prefill_s)
        return forward(self, kv, input_ids, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward", slowed)
    monkeypatch.setattr(ModelRunner, "warm_up", lambda self, batch_size: None)  # no kernels to choose by timing
    report = tmp_path / "costs.json"
    args = [f"model={tiny_model_dir}", f"prompts={tmp_path / 'prompts.jsonl'}", "num_prompts=4", "costs=true"]
    args += ["strategies=[autoregressive]", "batch_sizes=[1,2]", "cost_new_tokens=[1]", "cost_cache_tokens=8"]
    args += ["torch_threads=1", "max_new_tokens=6", "repeats=1", f"report={report}"]
    assert cli(["bench", *args]) == 0
    plain = {entry["batch_size"]: entry["plain_step_ms"] for entry in json.loads(report.read_text())["batches"]}
    assert all(1e3 * step_s <= ms < 1.5e3 * step_s for ms in plain.values()), plain

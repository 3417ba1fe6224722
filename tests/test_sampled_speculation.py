"""Sampled speculation keeps the target's distribution over drafts of 3 tokens: self-speculation
(the early-exit draft) directly, and a speculative job with a draft model end to end (chi-square
against the target's exact probabilities of every completion, as in tests/test_job.py).

Checked by hand: with the residual draw at a rejection taken from p instead of norm(max(0, p − q))
(`acceptance.rejection_chain`), both tests fail. The job test is slow-ish (a job of 600 rows, about
a minute on a loaded 2-core machine) but stays in CI: it is the one that covers the job's path.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from conftest import build_tiny_model
from test_early_exit import LAYERS, trained_like_exits
from test_job import (
    _chi2_critical,
    _chi_square,
    _completion_probabilities,
    _config,
    _read_logs,
    _read_output,
    _sequence_probabilities,
)
from transformers import AutoModelForCausalLM

from pipeline.driver import run_job
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

DRAFTED = 3  # draft tokens per step: the prefill's token, one step of 3 drafts and its bonus = 5 tokens


def test_sampled_self_speculation_keeps_the_targets_distribution(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", seed=2, layers=LAYERS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    options = StrategyOptions(name="self_speculative", num_speculative_tokens=DRAFTED)
    options.self_speculative.exit_layer = 1
    strategy = registry.create(options, registry.Models(ModelRunner(model), exits=trained_like_exits(model)))
    n, prompt = 1500, [5, 6, 7]
    sampling = SamplingParams(temperature=1.0, top_k=2, seed=3)
    params = GenerationParams(2 + DRAFTED, sampling, eos_token_ids=frozenset(), ignore_eos=True)
    out = strategy.generate([RowRequest(prompt=prompt, key=i) for i in range(n)], params)
    assert out.stats["draft_tokens"] >= n * DRAFTED  # every row drafted 3 tokens in its first step
    assert 0 < out.stats["accepted_tokens"] < out.stats["draft_tokens"]  # rejections and acceptances
    expected = _sequence_probabilities(model, prompt, sampling, 2 + DRAFTED)
    observed = Counter(tuple(r.tokens) for r in out.rows)
    assert set(observed) <= set(expected)
    chi2, dof = _chi_square(observed, expected, n)
    assert chi2 < _chi2_critical(dof), (chi2, dof, observed)


def test_sampled_speculative_job_over_3_token_drafts_keeps_the_targets_distribution(
    tmp_path, tiny_model_dir, tiny_draft_dir
):
    (tmp_path / "in").mkdir()
    n, prompt = 600, "def add(a, b):"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [prompt] * n}), tmp_path / "in" / "a.parquet")
    sampling = SamplingParams(temperature=1.0, top_k=2, seed=11)
    config = _config(
        tmp_path,
        tiny_model_dir,
        "input.keep_columns=[]",
        f"input.rows_per_unit={n}",
        "workers.batch_size=200",
        f"generation.max_new_tokens={2 + DRAFTED}",
        f"model.draft={tiny_draft_dir}",
        "strategy.name=speculative",
        f"strategy.num_speculative_tokens={DRAFTED}",
        "strategy.adaptive=false",
        f"generation.temperature={sampling.temperature}",
        f"generation.top_k={sampling.top_k}",
        f"generation.seed={sampling.seed}",
    )
    assert run_job(config).status == "succeeded"
    logs = _read_logs(tmp_path / "out")
    drafted, accepted = sum(r["draft_tokens"] for r in logs), sum(r["accepted_tokens"] for r in logs)
    assert drafted >= n * DRAFTED and 0 < accepted < drafted
    expected = _completion_probabilities(tiny_model_dir, prompt, sampling, length=2 + DRAFTED)
    observed = Counter(r["completion"] for r in _read_output(tmp_path / "out").to_pylist())
    assert set(observed) <= set(expected)
    chi2, dof = _chi_square(observed, expected, n)
    assert chi2 < _chi2_critical(dof), (chi2, dof, observed)

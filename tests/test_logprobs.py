"""Log-probabilities come from the target's own forward: every lossless strategy reports plain
decoding's (float64), and they equal a full forward's log-softmax over the finished sequence; a job
writes them, with the token ids, as columns."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from mixed_prompts import PROMPTS
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.cli import main as cli
from strategies import registry
from strategies.artifacts.exits import untrained_exits
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.methods.calm import CALM_LOGPROBS_REFUSAL
from strategies.options import StrategyOptions
from strategies.runtime.logprobs import score_tokens
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from workers.common.contract import derived_row_id

TOP = 3
LOSSLESS = [
    "autoregressive",
    "speculative",
    "prompt_lookup",
    "lookahead",
    "medusa",
    "blockwise",
    "jacobi",
    "self_speculative",
    "auto",
]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


@pytest.fixture(scope="module")
def models(model, tiny_model_dir) -> registry.Models:
    """The target with every optional model: a draft that is the target itself (so drafts are
    accepted and verify forwards emit several tokens), heads and exits of random weights."""
    target = ModelRunner(model)
    exits = untrained_exits(model, [1], adapter_rank=4)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in exits.exits.values():
            torch.nn.init.normal_(module.up.weight, std=0.3)
    same = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    heads = tiny_heads(target, tiny_model_dir)
    return registry.Models(target, draft=same, heads=heads, exits=exits.double().eval().requires_grad_(False))


def _params(**sampling) -> GenerationParams:
    return GenerationParams(16, SamplingParams(**sampling), frozenset(), ignore_eos=True, logprobs=TOP)


def _generate(name: str, models: registry.Models, params: GenerationParams):
    options = StrategyOptions(name=name, num_speculative_tokens=4, adaptive=name == "auto")
    options.self_speculative.exit_layer = 1  # the tiny target has two layers
    controller = AdaptiveController() if name == "auto" else None
    requests = [RowRequest(prompt=list(p), key=i) for i, p in enumerate(PROMPTS)]
    return registry.create(options, models, controller).generate(requests, params)


def _full_forward_scores(model, prompt: list[int], tokens: list[int]):
    """(log-probabilities of `tokens`, top-TOP ids, their log-probabilities) from one forward over the
    whole sequence, no cache: the definition the strategies must meet."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0]  # [L, V]
    logp = logits[len(prompt) - 1 : -1].log_softmax(dim=-1)  # [T, V]: row t chose token t
    values, ids = logp.topk(TOP, dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1), ids, values


def _check_against_full_forward(model, prompt, row) -> None:
    chosen, ids, values = _full_forward_scores(model, prompt, row.tokens)
    assert len(row.logprobs) == len(row.tokens)
    mine = torch.tensor([s.logprob for s in row.logprobs], dtype=torch.float64)
    assert torch.allclose(mine, chosen, atol=1e-10, rtol=0)
    assert [list(s.top_ids) for s in row.logprobs] == ids.tolist()
    mine_top = torch.tensor([s.top_logprobs for s in row.logprobs], dtype=torch.float64)
    assert torch.allclose(mine_top, values, atol=1e-10, rtol=0)


def test_score_tokens_on_literal_logits():
    logits = torch.tensor([[0.0, 0.0, 2.0], [1.0, 3.0, -1.0]], dtype=torch.float64)
    scores = score_tokens(logits, torch.tensor([0, 1]), 2)
    z0 = torch.tensor(2.0).exp() + 2
    assert scores[0].logprob == pytest.approx(-float(z0.log()))
    assert scores[0].top_ids[0] == 2 and scores[1].top_ids == (1, 0)
    assert scores[1].top_logprobs[0] == pytest.approx(3 - float(torch.tensor([1.0, 3.0, -1.0]).logsumexp(0)))
    assert score_tokens(logits, torch.tensor([2, 2]), 0)[1].top_ids == ()


def test_every_lossless_strategy_reports_plain_decodings_logprobs(model, models):
    params = _params()
    reference = _generate("autoregressive", models, params).rows
    for prompt, row in zip(PROMPTS, reference, strict=True):
        _check_against_full_forward(model, prompt, row)
    for name in LOSSLESS[1:]:
        out = _generate(name, models, params)
        if name in ("speculative", "self_speculative", "medusa", "blockwise"):
            assert out.stats["accepted_tokens"] > 0, name  # scores taken from verify forwards
        for expected, row in zip(reference, out.rows, strict=True):
            assert row.tokens == expected.tokens, name
            for mine, plain in zip(row.logprobs, expected.logprobs, strict=True):
                assert mine.top_ids == plain.top_ids, name
                assert mine.logprob == pytest.approx(plain.logprob, abs=1e-10), name
                assert mine.top_logprobs == pytest.approx(plain.top_logprobs, abs=1e-10), name


@pytest.mark.parametrize("name", ["speculative", "lookahead"])
def test_sampled_rows_report_raw_target_logprobs(model, models, name):
    """At temperature > 0 the scores are still the raw log-softmax (no temperature, no top-k): a
    rejection-sampled or residual-drawn token is scored as the target scores it."""
    out = _generate(name, models, _params(temperature=0.8, top_k=20, seed=3))
    assert out.stats["draft_tokens"] > 0  # tokens chosen, and scored, by verify forwards
    for prompt, row in zip(PROMPTS, out.rows, strict=True):
        _check_against_full_forward(model, prompt, row)


def test_without_logprobs_rows_carry_none_and_calm_refuses_them(models):
    params = GenerationParams(4, SamplingParams(), frozenset(), ignore_eos=True)
    assert all(r.logprobs is None for r in _generate("speculative", models, params).rows)
    assert registry.problems(StrategyOptions(name="calm"), greedy=True, logprobs=True) == [CALM_LOGPROBS_REFUSAL]
    assert registry.problems(StrategyOptions(name="calm"), greedy=True) == []
    calm = registry.create(StrategyOptions(name="calm"), models)
    with pytest.raises(ValueError, match="no target log-probabilities"):
        calm.generate([RowRequest(prompt=[5, 6], key=0)], _params())


@pytest.fixture(scope="module")
def embedded_ray():
    yield
    ray.shutdown()


def _job(tmp_path: Path, model_dir: Path, out: str, *extra: str) -> list[str]:
    return [
        "generate",
        f"input.url={tmp_path / 'in'}",
        f"output.url={tmp_path / out}",
        f"model.target={model_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
        "model.eagle=null",
        "model.dtype=float64",
        "generation.max_new_tokens=8",
        "generation.ignore_eos=true",
        *extra,
    ]


def _rows(out: Path) -> dict[str, dict]:
    manifest = json.loads((out / "_manifest.json").read_text())
    table = pa.concat_tables([pq.read_table(out / p["part"]) for p in manifest["parts"]])
    return {r["row_id"]: r for r in table.to_pylist()}


def test_job_writes_ids_and_logprobs_equal_across_strategies(
    embedded_ray, tmp_path, model, tiny_model_dir, tiny_draft_dir
):
    (tmp_path / "in").mkdir()
    prompts = ["def add(a, b):", "import os\n", "class A:", None]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet")
    scores = ["output.logprobs=true", "output.top_logprobs=2", "output.token_ids=true"]
    assert cli(_job(tmp_path, tiny_model_dir, "plain", *scores)) == 0
    speculative = ["strategy.name=speculative", f"model.draft={tiny_draft_dir}", "strategy.adaptive=false"]
    assert cli(_job(tmp_path, tiny_model_dir, "spec", *scores, *speculative)) == 0
    plain, spec = _rows(tmp_path / "plain"), _rows(tmp_path / "spec")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for i, prompt in enumerate(prompts[:3]):
        row, other = plain[derived_row_id("a.parquet", i)], spec[derived_row_id("a.parquet", i)]
        assert other["strategy"] == "speculative" and other["token_ids"] == row["token_ids"]
        assert len(row["token_ids"]) == row["num_generated_tokens"] == 8
        assert tokenizer.decode(row["token_ids"]) == row["completion"]
        chosen, ids, values = _full_forward_scores(model, tokenizer(prompt)["input_ids"], row["token_ids"])
        for scored in (row, other):
            assert torch.allclose(torch.tensor(scored["logprobs"], dtype=torch.float64), chosen, atol=1e-10, rtol=0)
            assert [[t["token_id"] for t in top] for top in scored["top_logprobs"]] == ids[:, :2].tolist()
            top = torch.tensor([[t["logprob"] for t in top] for top in scored["top_logprobs"]], dtype=torch.float64)
            assert torch.allclose(top, values[:, :2], atol=1e-10, rtol=0)
    error = plain[derived_row_id("a.parquet", 3)]
    assert error["finish_reason"] == "error" and error["token_ids"] is None and error["logprobs"] is None


def test_calm_with_logprobs_is_refused_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["x"]}), tmp_path / "in" / "a.parquet")
    args = _job(tmp_path, Path("jobs/assets/models/target"), "out", "strategy.name=calm", "output.logprobs=true")
    args[4] = "model.exits=jobs/assets/models/exits"
    assert cli(args) == 2
    assert "no target log-probabilities" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

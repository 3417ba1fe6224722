"""Jacobi decoding is greedy decoding: its fixed point, reached block by block, in every mode."""

from __future__ import annotations

import pytest
import torch
from drafted import assert_drafted
from transformers import AutoModelForCausalLM

from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11, 12],
    [13],
    [14, 15, 16, 14, 15, 16],
    [17, 18, 19, 20, 21, 22],
    [23, 24],
    [25] * 11,
    [26, 27],
    [28],
]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def _params(n=20, **sampling):
    return GenerationParams(n, SamplingParams(**sampling), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _jacobi(target, mode, init="retrieval", block_size=5, adaptive=False):
    options = StrategyOptions(name="jacobi", adaptive=adaptive)
    options.jacobi.mode, options.jacobi.init, options.jacobi.block_size = mode, init, block_size
    return registry.create(options, registry.Models(target))


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
@pytest.mark.parametrize("mode", ["pj", "pgj", "hgj"])
def test_jacobi_equals_greedy_in_every_mode(target, prompts, mode):
    params = _params()
    reference = [r.tokens for r in AutoregressiveStrategy(target).generate(_requests(prompts), params).rows]
    for init in ("pad", "repeat", "retrieval"):
        out = _jacobi(target, mode, init).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference, init
        assert out.stats["jacobi_iterations"] > 0
        assert_drafted(out.stats, every_step=mode != "hgj")  # hgj decodes a block's tail plainly
        if mode == "pj":  # every iteration commits at least one token: at most n iterations per block
            assert out.stats["jacobi_iterations"] <= len(prompts) * (params.max_new_tokens - 1)


def test_a_model_at_its_fixed_point_converges_in_one_iteration(tiny_model_dir):
    """All logits equal: greedy emits token 0 forever, and a pad guess (token 0) is already the fixed point."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    target = ModelRunner(model)
    params = _params(21)
    out = _jacobi(target, "pgj", init="pad", block_size=4).generate(_requests(PROMPTS), params)
    assert all(r.tokens == [0] * 21 for r in out.rows)
    assert out.stats["jacobi_iterations_per_block"] <= 1.0
    # 20 tokens after the prefill's: blocks of 4, each converged in the iteration that first sees it,
    # which also commits the target's next token (the next block's first): 5, 4, 4, 4, 3 (room left).
    assert out.stats["jacobi_iterations"] == len(PROMPTS) * 5
    assert out.stats["jacobi_committed_per_iteration"] == 4.0
    assert out.stats["jacobi_fast_forwarded"] == len(PROMPTS) * (20 - 5)


def test_jacobi_samples_plainly_and_says_so(target):
    params = _params(12, temperature=0.9, seed=5)
    reference = AutoregressiveStrategy(target).generate(_requests(PROMPTS), params).rows
    for adaptive in (False, True):
        rows = _jacobi(target, "pgj", adaptive=adaptive).generate(_requests(PROMPTS), params).rows
        assert [r.tokens for r in rows] == [r.tokens for r in reference]
        assert {r.strategy for r in rows} == {"autoregressive"}


def test_jacobi_reads_the_verify_logits_without_asking_for_hidden_states(target, monkeypatch):
    """Jacobi's next iterate is the target's choice at every verify slot: the logits are enough, so
    no forward of its batches (prefill, verify or plain) computes the hidden states."""
    asked: list[bool] = []
    forward = target.forward

    def recording(*args, **kwargs):
        asked.append(kwargs.get("want_hidden", False))
        return forward(*args, **kwargs)

    monkeypatch.setattr(target, "forward", recording)
    params = _params()
    reference = [r.tokens for r in AutoregressiveStrategy(target).generate(_requests(PROMPTS), params).rows]
    asked.clear()
    out = _jacobi(target, "pgj", "repeat").generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["jacobi_iterations"] > 0 and out.stats["jacobi_committed_per_iteration"] > 1
    assert asked and not any(asked)

"""Autoregressive decoding equals transformers' own greedy `generate` (the oracle), in float64."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from strategies.base import FINISH_LENGTH, FINISH_STOP, GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams, row_key

PROMPTS = [
    "def add(a, b):",
    "import os\nimport sys\n\nclass",
    "x",
    "    return self._frame.f_locals.get(name, default) if",
    "for i in range(10):\n    print(",
]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _params(max_new_tokens: int, ignore_eos: bool = True, **sampling) -> GenerationParams:
    return GenerationParams(
        max_new_tokens=max_new_tokens,
        sampling=SamplingParams(**sampling),
        eos_token_ids=frozenset({0}),
        ignore_eos=ignore_eos,
    )


def _requests(tokenizer, prompts):
    return [RowRequest(prompt=tokenizer(p)["input_ids"], key=row_key(p)) for p in prompts]


def test_greedy_equals_transformers_generate(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    strategy = AutoregressiveStrategy(ModelRunner(model))
    out = strategy.generate(_requests(tokenizer, PROMPTS), _params(20))
    for prompt, row in zip(PROMPTS, out.rows, strict=True):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=20, do_sample=False, min_new_tokens=20, pad_token_id=0)
        assert row.tokens == expected[0, ids.shape[1] :].tolist()
        assert row.finish_reason == FINISH_LENGTH


def test_row_alone_equals_row_in_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    strategy = AutoregressiveStrategy(ModelRunner(model))
    for sampling in ({}, {"temperature": 0.9, "top_k": 50, "top_p": 0.9, "seed": 7}):
        batch = strategy.generate(_requests(tokenizer, PROMPTS), _params(16, **sampling)).rows
        for prompt, in_batch in zip(PROMPTS, batch, strict=True):
            alone = strategy.generate(_requests(tokenizer, [prompt]), _params(16, **sampling)).rows[0]
            assert alone.tokens == in_batch.tokens


def test_eos_and_stop_and_context_end_rows(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    runner = ModelRunner(model)
    strategy = AutoregressiveStrategy(runner)
    free = strategy.generate(_requests(tokenizer, PROMPTS[:2]), _params(12)).rows
    # Declare the 3rd generated token of row 0 to be EOS: the row stops right there.
    eos = free[0].tokens[2]
    params = GenerationParams(12, SamplingParams(), eos_token_ids=frozenset({eos}), ignore_eos=False)
    stopped = strategy.generate(_requests(tokenizer, PROMPTS[:2]), params).rows
    assert stopped[0].tokens == free[0].tokens[: free[0].tokens.index(eos) + 1]
    assert stopped[0].finish_reason == FINISH_STOP
    # A stop condition after 5 tokens ends only that row.
    requests = _requests(tokenizer, PROMPTS[:2])
    requests[1].stop = lambda tokens: len(tokens) == 5
    rows = strategy.generate(requests, _params(12)).rows
    assert rows[1].tokens == free[1].tokens[:5] and rows[1].finish_reason == FINISH_STOP
    assert rows[0].tokens == free[0].tokens
    # A prompt one token short of the context can add exactly one token.
    near_full = [RowRequest(prompt=[5] * (runner.max_context - 1), key=1)]
    row = strategy.generate(near_full, _params(50)).rows[0]
    assert len(row.tokens) == 1 and row.finish_reason == FINISH_LENGTH


def test_sampling_is_reproducible_and_seed_dependent(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    strategy = AutoregressiveStrategy(ModelRunner(model))
    runs = [
        strategy.generate(_requests(tokenizer, PROMPTS), _params(12, temperature=1.0, seed=s)).rows for s in (1, 1, 2)
    ]
    assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]]
    assert [r.tokens for r in runs[0]] != [r.tokens for r in runs[2]]

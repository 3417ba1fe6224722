"""The ragged slot cache: dropping rows, rolling back and compacting never change a row's logits."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from strategies.runtime.runner import ModelRunner

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


def _step(runner, kv, tokens):
    ids = torch.tensor(tokens)[:, None]
    return runner.forward(kv, ids, kv.next_pos[:, None], torch.ones_like(ids, dtype=torch.bool)).logits[:, -1]


def _reference(runner, prompt, extra):
    kv = runner.new_kv(1)
    runner.prefill(kv, [prompt])
    return _step(runner, kv, [extra])[0]


def test_select_rows_compact_and_rollback_keep_logits(tiny_model_dir):
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    kv = runner.new_kv(3)
    runner.prefill(kv, PROMPTS)
    assert kv.next_pos.tolist() == [7, 2, 4] and kv.waste() > 0

    # Roll rows back after a two-token chain: row 0 keeps one token, row 1 none, row 2 both.
    chain = torch.tensor([[20, 21], [22, 23], [24, 25]])
    positions = kv.next_pos[:, None] + torch.arange(2)
    runner.forward(kv, chain, positions, torch.ones_like(chain, dtype=torch.bool))
    rejected = torch.zeros_like(kv.valid)
    rejected[0, -1] = True
    rejected[1, -2:] = True
    kv.invalidate(rejected)
    assert kv.next_pos.tolist() == [8, 2, 6]

    kv.select_rows(torch.tensor([1, 2]))  # row 0 finished
    kv.compact()
    assert kv.waste() < 0.5
    logits = _step(runner, kv, [30, 31])
    assert torch.allclose(logits[0], _reference(runner, PROMPTS[1], 30), atol=1e-12)
    assert torch.allclose(logits[1], _reference(runner, [*PROMPTS[2], 24, 25], 31), atol=1e-12)


def test_storage_grows_without_changing_contents(tiny_model_dir):
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    kv = runner.new_kv(1)
    runner.prefill(kv, [PROMPTS[0]])
    tokens = list(PROMPTS[0])
    for t in range(70):  # past the first capacity of 64 slots
        logits = _step(runner, kv, [40 + t % 50])
        tokens.append(40 + t % 50)
    full = runner.model(torch.tensor([tokens])).logits[0, -1]
    assert torch.allclose(logits[0], full, atol=1e-12)

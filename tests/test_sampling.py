"""Keyed random draws and logit filtering on literal inputs."""

from __future__ import annotations

import torch

from strategies.runtime.sampling import SamplingParams, filtered_probs, keyed_uniform, row_key, sample_from


def test_keyed_uniform_is_a_pure_function_of_its_key():
    keys = torch.tensor([row_key("a"), row_key("b"), row_key("a")])
    positions = torch.tensor([3, 3, 3])
    u = keyed_uniform(5, keys, positions)
    assert u[0] == u[2] and u[0] != u[1]
    assert torch.equal(u, keyed_uniform(5, keys, positions))
    assert not torch.equal(u, keyed_uniform(6, keys, positions))
    assert not torch.equal(u, keyed_uniform(5, keys, positions, stream=1))
    # In a batch or alone, a row's draw is the same.
    assert keyed_uniform(5, keys[1:2], positions[1:2])[0] == u[1]


def test_keyed_uniform_is_uniform():
    u = keyed_uniform(0, torch.full((20000,), row_key("r")), torch.arange(20000))
    assert float(u.min()) >= 0 and float(u.max()) < 1
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert torch.all((counts - 2000).abs() < 200), counts


def test_row_key_is_stable():
    assert row_key("shard.parquet#0") == row_key("shard.parquet#0") != row_key("shard.parquet#1")


def test_top_k_and_top_p_filter_literal_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    top2 = filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([[0.625, 0.375, 0, 0]], dtype=torch.float64))
    nucleus = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert torch.allclose(nucleus, torch.tensor([[0.625, 0.375, 0, 0]], dtype=torch.float64))
    tiny = filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.equal(tiny, torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64))


def test_inverse_cdf_draw_on_literal_probabilities():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]]).expand(5, 4)
    u = torch.tensor([0.0, 0.19, 0.2, 0.69, 0.999])
    assert sample_from(probs, u).tolist() == [0, 0, 2, 2, 3]

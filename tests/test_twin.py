"""`accelgen twin`: a wider, deeper copy of the shipped family that computes the same tokens.

The twins here are a few times the shipped width (hidden 1024: four times 256, so the RMSNorm
rescaling is a power of two and float32 weights hold the widened values exactly) and one filler
layer deep, so CI stays fast; the 0.5B twin is made on demand for benchmarks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mixed_prompts import PROMPTS
from transformers import AutoModelForCausalLM

from jobs.cli import main
from jobs.shipped import SHIPPED_TARGET, shipped
from jobs.twin.command import TwinConfig, build, resolve_shape
from jobs.twin.widen import LayerShape, head_layout, layout_problem, norm_weight, twin_eps
from pipeline.errors import JobError
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.sampling import SamplingParams
from workers.model_loading import load_models

SHIPPED = LayerShape(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=768)
WIDE = {
    "shape": "custom",
    "hidden_size": 1024,
    "num_hidden_layers": 7,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "intermediate_size": 768,
    "dtype": "float32",
}


def _twin(tmp_path_factory, name: str, **shape) -> str:
    out = tmp_path_factory.mktemp(name) / "twin"
    build(TwinConfig(output_dir=str(out), **shape))
    return str(out)


@pytest.fixture(scope="module")
def wide_twin(tmp_path_factory) -> str:
    return _twin(tmp_path_factory, "wide", **WIDE)


def _generate(strategy, prompts, tokens=16):
    params = GenerationParams(tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    return strategy.generate([RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)], params)


def _strategy(name: str, models, **options):
    chosen = StrategyOptions(name=name)
    for section, values in options.items():
        for key, value in values.items():
            setattr(getattr(chosen, section), key, value)
    return registry.create(chosen, models)


def test_query_heads_sit_beside_copies_of_the_key_value_heads_they_read():
    qwen_like = LayerShape(896, 14, 2, 64, 4864)
    layout = head_layout(SHIPPED, qwen_like)
    assert layout.query_heads == (0, 1, 7, 8)  # groups of 7: source heads 0, 1 read kv 0; 2, 3 read kv 1
    assert layout.kv_sources == (0, 1)
    full_attention = LayerShape(512, 4, 4, 128, 1024)  # groups of one: each source kv head is copied twice
    layout = head_layout(SHIPPED, full_attention)
    assert layout.query_heads == (0, 1, 2, 3)
    assert layout.kv_sources == (0, 0, 1, 1)
    # head_dim 64 -> 128: rotary pair (i, i + 32) goes to (2i, 2i + 64), which turns at the same frequency
    assert layout.dims[:3] == (0, 2, 4) and layout.dims[32:35] == (64, 66, 68)


def test_shapes_that_cannot_hold_the_source_are_refused_with_the_reason():
    assert layout_problem(SHIPPED, LayerShape(896, 14, 2, 64, 4864)) is None
    assert "num_key_value_heads" in layout_problem(SHIPPED, LayerShape(512, 4, 1, 128, 1024))
    assert "multiple of the source's 64" in layout_problem(SHIPPED, LayerShape(480, 5, 5, 96, 1024))
    assert "at least" in layout_problem(SHIPPED, LayerShape(128, 2, 2, 64, 1024))


def test_the_rescaled_norm_of_a_zero_padded_state_is_the_source_norm_padded():
    x, weight, eps = torch.tensor([3.0, -1.0, 2.0], dtype=torch.float64), torch.tensor([0.5, 2.0, 1.0]).double(), 1e-6
    source = x / torch.sqrt(x.pow(2).mean() + eps) * weight
    wide_x = torch.cat([x, torch.zeros(9, dtype=torch.float64)])
    wide = wide_x / torch.sqrt(wide_x.pow(2).mean() + twin_eps(eps, 3, 12)) * norm_weight(weight, 12)
    assert torch.allclose(wide[:3], source, rtol=1e-14) and not wide[3:].any()
    assert twin_eps(1e-6, 256, 1024) == 0.25e-6 and math.isclose(norm_weight(weight, 12)[0].item(), 0.25)


def test_presets_and_overrides_resolve_and_bad_keys_are_named(tmp_path):
    shape, layers = resolve_shape(TwinConfig(output_dir="x", shape="0.5b"))
    assert (shape.hidden_size, layers, shape.num_attention_heads, shape.head_dim) == (896, 24, 14, 64)
    shape, layers = resolve_shape(TwinConfig(output_dir="x", shape="7b", num_hidden_layers=4))
    assert (shape.head_dim, shape.num_key_value_heads, layers) == (128, 32, 4)
    with pytest.raises(JobError, match="shape='13b' is not a preset"):
        resolve_shape(TwinConfig(output_dir="x", shape="13b"))
    with pytest.raises(JobError, match=r"hidden_size, num_hidden_layers.* with shape=custom"):
        resolve_shape(TwinConfig(output_dir="x", shape="custom", num_attention_heads=4))
    with pytest.raises(JobError, match="num_hidden_layers=3 is below the source's 6"):
        build(TwinConfig(output_dir=str(tmp_path / "t"), **{**WIDE, "num_hidden_layers": 3}))
    with pytest.raises(JobError, match=r"output_dir=.* exists"):
        build(TwinConfig(output_dir=str(tmp_path), **WIDE))


def test_transformers_loads_the_twin_and_computes_the_shipped_logits(wide_twin):
    source = AutoModelForCausalLM.from_pretrained(SHIPPED_TARGET, dtype=torch.float64)
    twin = AutoModelForCausalLM.from_pretrained(f"{wide_twin}/target", dtype=torch.float64)
    assert twin.config.hidden_size == 1024 and twin.config.num_hidden_layers == 7
    ids = torch.randint(2, 8000, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(twin(ids).logits, source(ids).logits, rtol=0, atol=1e-9)


BATCH1_DRAFTERS = [("medusa", {}), ("eagle", {"eagle": {"tree": "chain"}}), ("eagle", {"eagle": {"tree": "dynamic"}})]


@pytest.mark.parametrize(
    ("prompts", "drafters"),
    [(PROMPTS[:1], BATCH1_DRAFTERS), (PROMPTS, [("blockwise", {}), ("eagle", {"eagle": {"tree": "static"}})])],
    ids=["batch1", "batch8"],
)
def test_the_twin_and_its_drafters_decode_and_draft_what_the_shipped_family_does(wide_twin, prompts, drafters):
    kinds = ("heads", "eagle")
    shipped_models = load_models(
        str(SHIPPED_TARGET), torch.float64, torch.device("cpu"), {k: str(shipped(k)) for k in kinds}
    ).models
    twin_models = load_models(
        f"{wide_twin}/target", torch.float64, torch.device("cpu"), {k: f"{wide_twin}/{k}" for k in kinds}
    ).models
    reference = [r.tokens for r in _generate(AutoregressiveStrategy(shipped_models.target), prompts).rows]
    assert [r.tokens for r in _generate(AutoregressiveStrategy(twin_models.target), prompts).rows] == reference
    for name, options in drafters:
        on_shipped = _generate(_strategy(name, shipped_models, **options), prompts)
        on_twin = _generate(_strategy(name, twin_models, **options), prompts)
        assert [r.tokens for r in on_twin.rows] == reference, name
        for stat in ("accepted_tokens", "verify_steps", "faults"):  # the same drafts, accepted alike
            assert on_twin.stats[stat] == on_shipped.stats[stat], (name, options, stat)
        assert on_twin.stats["accepted_tokens"] > 0


def test_a_wider_head_dimension_and_full_attention_keep_the_tokens_and_shards_load(tmp_path_factory):
    """head_dim 128 (rotary dimensions interleaved) with one key/value head per query head, written in
    shards of under a layer: transformers reads the index, and greedy tokens are the shipped target's
    (rotary frequencies are computed in float32, so logits agree to about 1e-5, not exactly)."""
    shape = {**WIDE, "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4, "shard_gb": 0.004}
    twin_dir = _twin(tmp_path_factory, "mha", heads=None, eagle=None, **shape)
    index = json.loads((Path(twin_dir) / "target" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    source = load_models(str(SHIPPED_TARGET), torch.float64, torch.device("cpu")).models.target
    twin = load_models(f"{twin_dir}/target", torch.float64, torch.device("cpu")).models.target
    expected = [r.tokens for r in _generate(AutoregressiveStrategy(source), PROMPTS).rows]
    assert [r.tokens for r in _generate(AutoregressiveStrategy(twin), PROMPTS).rows] == expected


def test_the_command_writes_a_card_saying_what_the_twin_is_for(tmp_path, capsys):
    assert main(["twin", "--help"]) == 0
    assert "output_dir" in capsys.readouterr().out
    out = tmp_path / "twin"
    assert main(["twin", f"output_dir={out}", *(f"{k}={v}" for k, v in WIDE.items()), "eagle=null"]) == 0
    card = (out / "README.md").read_text()
    assert "not a better model" in card and "| hidden size | 1024 | 256 |" in card
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "heads", "target"]
    assert json.loads((out / "heads" / "heads.json").read_text())["hidden_size"] == 1024

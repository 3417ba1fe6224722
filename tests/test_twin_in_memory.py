"""The twin made straight into a device's memory (`jobs/twin/in_memory.py`) and the device check's step
that decodes with it (`jobs/twin/device_step.py`), here on the CPU: the same weights and tokens as the
written twin of the same config and as the shipped target, and the step's JSON section at a toy size.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from mixed_prompts import PROMPTS
from safetensors.torch import load_file
from transformers import AutoConfig

from jobs.device_check import STEP_LIMITS_S
from jobs.shipped import SHIPPED_TARGET, shipped
from jobs.twin.command import TwinConfig, build, resolve_shape
from jobs.twin.device_step import DRY_RUN, STRATEGIES, aim_met, twin_step
from jobs.twin.in_memory import twin_in_memory, twin_models
from jobs.twin.target import source_weights, twin_tensors
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.sampling import SamplingParams
from workers.model_loading import load_models

# Twice the shipped width, two filler layers deep: the step's dry-run twin, without its dtype.
SMALL = {key: value for key, value in DRY_RUN.twin.items() if key != "dtype"}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def written_twin(tmp_path_factory) -> str:
    """The same twin written by `accelgen twin`, in float64 as the in-memory one is made."""
    out = tmp_path_factory.mktemp("written") / "twin"
    build(TwinConfig(output_dir=str(out), dtype="float64", eagle=None, **SMALL))
    return str(out)


@pytest.fixture(scope="module")
def twin64():
    return twin_in_memory(TwinConfig(dtype="float64", **SMALL), CPU)


def _tokens(strategy, prompts) -> list[list[int]]:
    params = GenerationParams(16, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    return [r.tokens for r in strategy.generate([RowRequest(list(p), i) for i, p in enumerate(prompts)], params).rows]


def test_twin_tensors_on_the_cpu_device_are_those_of_the_written_twin_and_its_seed(written_twin, twin64):
    """`device="cpu"` draws the filler layers from the CPU generator of the seed as the written twin
    did, and the in-memory twin's target holds every tensor the written one does."""
    source = AutoConfig.from_pretrained(SHIPPED_TARGET)
    shape, layers = resolve_shape(TwinConfig(**SMALL))
    weights = source_weights(SHIPPED_TARGET)
    on_cpu = dict(twin_tensors(weights, source, shape, layers, torch.float32, 0, device=CPU))
    default = dict(twin_tensors(weights, source, shape, layers, torch.float32, 0))
    assert on_cpu.keys() == default.keys() and all(torch.equal(on_cpu[k], default[k]) for k in default)
    rows = shape.num_attention_heads * shape.head_dim
    first_draw = torch.randn(rows, 512, generator=torch.Generator().manual_seed(0))
    assert torch.equal(on_cpu["model.layers.6.self_attn.q_proj.weight"], first_draw * 0.02)
    written = load_file(f"{written_twin}/target/model.safetensors")
    in_memory = twin64.target.state_dict()
    assert set(written) <= set(in_memory) and all(torch.equal(in_memory[k], t) for k, t in written.items())


@pytest.mark.parametrize(
    ("prompts", "drafting"),
    [(PROMPTS[:1], ("eagle", "speculative")), (PROMPTS, ("eagle",))],
    ids=["batch1", "batch8_mixed_lengths"],
)
def test_the_in_memory_twin_decodes_what_the_written_twin_and_the_shipped_target_do(
    written_twin, twin64, prompts, drafting
):
    shipped_target = load_models(str(SHIPPED_TARGET), torch.float64, CPU).models.target
    written = load_models(f"{written_twin}/target", torch.float64, CPU).models.target
    in_memory = twin_models(twin64, torch.float64, CPU, str(shipped("draft"))).models
    expected = _tokens(AutoregressiveStrategy(shipped_target), prompts)
    assert _tokens(AutoregressiveStrategy(written), prompts) == expected
    assert _tokens(AutoregressiveStrategy(in_memory.target), prompts) == expected
    for name in drafting:  # its widened drafters (and the draft model as it is) keep the tokens
        assert _tokens(registry.create(StrategyOptions(name=name), in_memory), prompts) == expected, name


def test_the_twin_step_records_its_section_at_a_toy_size():
    saved = []
    # The shipped width, one filler layer deep: the step's machinery at the shipped model's cost.
    shipped_width = {**DRY_RUN.twin, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 768}
    tiny = dataclasses.replace(
        DRY_RUN, twin=shipped_width, sizes=((1, 1), (2, 2)), max_new_tokens=2, max_prompt_tokens=16
    )
    found = twin_step(True, lambda section: saved.append(json.dumps(section)), size=tiny)
    assert len(saved) == 3 and json.loads(saved[-1]) == json.loads(json.dumps(found))
    assert (found["device"], found["dtype"], found["layers"], found["cuda_graphs"]) == ("cpu", "float32", 7, False)
    assert found["build_s"] > 0 and found["parameters"] > 0
    assert [(r["batch_size"], r["contender"]) for r in found["rows"]] == [(b, s) for b in (1, 2) for s in STRATEGIES]
    assert all(r["tokens_per_s"] > 0 and 0 <= r["token_agreement"] <= 1 for r in found["rows"])
    assert found["aim_batch1_met"] in (True, False)


def test_the_aim_needs_eagle_and_auto_at_batch1_and_the_step_limits_fit_one_call():
    def row(contender: str, ratio: float, batch_size: int = 1) -> dict:
        return {"batch_size": batch_size, "contender": contender, "x_autoregressive": ratio}

    assert aim_met([row("eagle", 2.6), row("auto", 2.5), row("auto", 1.0, 8)]) is True
    assert aim_met([row("eagle", 2.6), row("auto", 2.4)]) is False
    assert aim_met([row("eagle", 2.6)]) is None
    assert sum(limit for _, limit, _ in STEP_LIMITS_S) <= 9 * 60
    assert "twin_7b" in [name for name, _, _ in STEP_LIMITS_S]

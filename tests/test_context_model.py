"""Every lossless strategy is greedy decoding on a target that reads its whole context.

The tiny random models of the other equivalence tests barely use their context: their greedy choice
is mostly a function of the last token, so a verifier or drafter that drops a cached slot, feeds a
token at the wrong position or keeps a finished row's state still gives their tokens. This target
is the tiny random Llama with its attention sharpened (queries and keys scaled up, so attention
weighs positions and tokens sharply) and made loud (its output projection scaled up, so what it
reads outweighs the token's own embedding). `test_the_target_reads_its_whole_context` checks that
those faults change its tokens; the equivalence tests then run every lossless strategy on it, at
batch 1 and on the mixed-length batch, in float64.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from drafted import assert_drafted
from mixed_prompts import PROMPTS
from test_eagle import tiny_eagle
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM

from strategies import registry
from strategies.artifacts.exits import untrained_exits
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

QUERY_KEY_SCALE, OUTPUT_SCALE = 10.0, 30.0
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def context_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(QUERY_KEY_SCALE)
            layer.self_attn.k_proj.weight.mul_(QUERY_KEY_SCALE)
            layer.self_attn.o_proj.weight.mul_(OUTPUT_SCALE)
    path = tmp_path_factory.mktemp("context-model")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def target(context_model_dir: Path) -> ModelRunner:
    return ModelRunner(AutoModelForCausalLM.from_pretrained(context_model_dir, dtype=torch.float64))


@pytest.fixture(scope="module")
def models(target: ModelRunner, context_model_dir: Path, tiny_draft_dir: Path) -> registry.Models:
    exits = untrained_exits(target.model, [1], adapter_rank=4)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in exits.exits.values():
            torch.nn.init.normal_(module.up.weight, std=0.3)
    return registry.Models(
        target,
        draft=ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_draft_dir, dtype=torch.float64)),
        heads=tiny_heads(target, context_model_dir),
        eagle=tiny_eagle(target, context_model_dir),
        exits=exits.double().eval().requires_grad_(False),
    )


def _params() -> GenerationParams:
    return GenerationParams(NEW_TOKENS, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _greedy(target: ModelRunner, prompts: list[list[int]], fault=None) -> list[list[int]]:
    """Greedy decoding over the runner's cache, with `fault(kv)` done to it after the prefill."""
    kv = target.new_kv(len(prompts))
    tokens = target.prefill(kv, prompts).logits[:, -1].argmax(-1)[:, None]  # [B, 1]
    if fault is not None:
        with torch.inference_mode():  # the cache's tensors are inference tensors
            fault(kv)
    out = [tokens]
    for _ in range(NEW_TOKENS - 1):
        logits = target.forward(kv, out[-1], kv.next_pos[:, None], torch.ones_like(out[-1], dtype=torch.bool)).logits
        out.append(logits[:, -1].argmax(-1)[:, None])
    return torch.cat(out, dim=1).tolist()


def test_the_target_reads_its_whole_context(target):
    """A dropped cache slot, a position one off, or another row's context change most rows' tokens:
    the faults the equivalence tests below must be able to see."""
    prompts = [p for p in PROMPTS if len(p) > 2]
    reference = _greedy(target, prompts)
    assert reference == [r.tokens for r in AutoregressiveStrategy(target).generate(_requests(prompts), _params()).rows]

    def changed(tokens):
        return sum(a != b for a, b in zip(tokens, reference, strict=True))

    def drop_a_middle_slot(kv: RaggedKV):
        width = kv.valid.shape[1]
        for row, prompt in enumerate(prompts):
            kv.valid[row, width - len(prompt) // 2 - 1] = False

    def one_position_on(kv: RaggedKV):
        kv.next_pos += 1

    assert changed(_greedy(target, prompts, drop_a_middle_slot)) >= len(prompts) // 2
    assert changed(_greedy(target, prompts, one_position_on)) >= len(prompts) // 2
    # Rows that end alike but began otherwise go on otherwise: a row decoding on from another's state
    # (its cache or a drafter's record of it) shows.
    same_end = [[*p[:-1], 40] for p in prompts]
    assert (
        changed(_greedy(target, same_end)) >= len(prompts) // 2
        and len({tuple(t) for t in _greedy(target, same_end)}) > 2
    )


LOSSLESS = {
    "speculative": {},
    "specdec": {"specdec.top_beta": 1, "specdec.tolerance": 0.0},
    "prompt_lookup": {},
    "lookahead": {},
    "medusa": {},
    "blockwise": {},
    "eagle chain": {"eagle.tree": "chain"},
    "eagle static": {"eagle.tree": "static"},
    "eagle dynamic": {"eagle.tree": "dynamic"},
    "jacobi": {},
    "self_speculative": {"self_speculative.exit_layer": 1},
}


def _options(label: str) -> StrategyOptions:
    options = StrategyOptions(name=label.split()[0], adaptive=False)
    for key, value in LOSSLESS[label].items():
        section, field = key.split(".")
        setattr(getattr(options, section), field, value)
    return options


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_every_lossless_strategy_is_greedy_decoding_on_it(models, prompts):
    assert set(registry.drafting()) - {label.split()[0] for label in LOSSLESS} == set()
    params = _params()
    reference = [r.tokens for r in AutoregressiveStrategy(models.target).generate(_requests(prompts), params).rows]
    for label in LOSSLESS:
        out = registry.create(_options(label), models).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference, label
        if label != "prompt_lookup" or len(prompts) > 1:  # a one-token prompt may repeat nothing
            assert_drafted(out.stats)
    options = StrategyOptions(name="auto")
    options.self_speculative.exit_layer = 1  # the target's one inner layer
    auto = registry.create(options, models, AdaptiveController())
    assert [r.tokens for r in auto.generate(_requests(prompts), params).rows] == reference, "auto"

"""Sampling controls (presence, frequency and repetition penalties, min_p, min_tokens, stop token ids,
logit bias): each does to the logits what its definition says, plain decoding follows it, and every
lossless drafter emits plain decoding's tokens under it (float64), since each verify slot's logits are
controlled with the draft path before it as plain decoding's would be."""

from __future__ import annotations

import math

import pytest
import torch
from mixed_prompts import PROMPTS
from scripted_proposer import ScriptedProposer
from test_eagle import tiny_eagle
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM

from strategies import registry
from strategies.artifacts.exits import untrained_exits
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.logit_controls import LogitControls, SlotHistory, control_logits, slot_outputs
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft
from strategies.verification.rules import ExactMatch
from strategies.verification.speculative import SpeculativeStrategy

EOS = 0
NEW_TOKENS = 16
LOSSLESS = [
    "speculative",
    "prompt_lookup",
    "lookahead",
    "medusa",
    "blockwise",
    "eagle",
    "jacobi",
    "self_speculative",
    "auto",
]


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def _controlled(values, controls, prompt=(), output=(), ends=frozenset(), temperature=0.0) -> list[float]:
    slot = SlotHistory(controls, list(prompt), list(output))
    return control_logits(_row(values), [slot], ends, temperature)[0].tolist()


def test_each_control_on_literal_logits():
    logits = [2.0, -1.0, 0.5, -0.5, 1.0]
    assert _controlled(logits, LogitControls(presence_penalty=0.5), output=[0, 0, 3]) == [1.5, -1.0, 0.5, -1.0, 1.0]
    assert _controlled(logits, LogitControls(frequency_penalty=0.5), output=[0, 0, 3]) == [1.0, -1.0, 0.5, -1.0, 1.0]
    both = LogitControls(presence_penalty=-1.0, frequency_penalty=0.25)
    assert _controlled(logits, both, output=[4, 4, 4]) == [2.0, -1.0, 0.5, -0.5, 1.25]
    # Repetition: prompt and output tokens alike, positive logits divided, negative multiplied, once each.
    rep = LogitControls(repetition_penalty=2.0)
    assert _controlled(logits, rep, prompt=[0, 1], output=[1, 2]) == [1.0, -2.0, 0.25, -0.5, 1.0]
    assert _controlled(logits, LogitControls(logit_bias=((1, 3.0), (4, -100.0)))) == [2.0, 2.0, 0.5, -0.5, -99.0]
    held = LogitControls(min_tokens=2, stop_token_ids=(3,))
    inf = -math.inf
    assert _controlled(logits, held, output=[2], ends=frozenset({0})) == [inf, -1.0, 0.5, inf, 1.0]
    assert _controlled(logits, held, output=[2, 2], ends=frozenset({0})) == logits  # two generated: free
    # min_p at temperature T: keep p(x) >= min_p * p_max, i.e. logit >= max + T ln(min_p).
    for temperature, expected in ((1.0, [True, False, True, False, True]), (0.5, [True, False, False, False, True])):
        probs = torch.tensor(logits, dtype=torch.float64).div(temperature).softmax(-1)
        kept = (probs >= 0.1 * probs.max()).tolist()
        at = _controlled(logits, LogitControls(min_p=0.1), temperature=temperature)
        assert [v != inf for v in at] == kept == expected
        assert [v for v, k in zip(at, kept, strict=True) if k] == [v for v, k in zip(logits, kept, strict=True) if k]
    assert _controlled(logits, LogitControls(min_p=0.1), temperature=0.0) == logits  # greedy: the argmax stays
    assert control_logits(_row(logits), [None], frozenset(), 0.0).tolist() == [logits]


def test_a_verify_slot_follows_the_output_and_its_draft_path():
    tree = Draft(tokens=[7, 8, 9, 10], parents=[-1, 0, 0, 2])
    assert slot_outputs([1, 2], tree) == [[1, 2], [1, 2, 7], [1, 2, 7, 8], [1, 2, 7, 9], [1, 2, 7, 9, 10]]


def _reference_controls(logits: torch.Tensor, c: LogitControls, prompt, output, ends) -> torch.Tensor:
    """The controls token by token, as their definitions read (vLLM's order)."""
    out = logits.clone()
    for token, bias in c.logit_bias:
        out[token] += bias
    if len(output) < c.min_tokens:
        for token in {*ends, *c.stop_token_ids}:
            out[token] = -math.inf
    for token in set(prompt) | set(output):
        out[token] = out[token] / c.repetition_penalty if out[token] > 0 else out[token] * c.repetition_penalty
    for token in set(output):
        out[token] -= c.frequency_penalty * output.count(token) + c.presence_penalty
    return out


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


@pytest.fixture(scope="module")
def target(model):
    return ModelRunner(model)


def _params(**sampling) -> GenerationParams:
    return GenerationParams(NEW_TOKENS, SamplingParams(**sampling), frozenset({EOS}))


def _requests(controls, prompts=PROMPTS):
    per_row = controls if isinstance(controls, list) else [controls] * len(prompts)
    return [RowRequest(list(p), key=i, controls=c) for i, (p, c) in enumerate(zip(prompts, per_row, strict=True))]


def _plain(target, controls, prompts=PROMPTS, params=None) -> list[list[int]]:
    out = AutoregressiveStrategy(target).generate(_requests(controls, prompts), params or _params())
    return [r.tokens for r in out.rows]


# Each control alone, at values that change the tiny model's greedy output; then all of them at once.
CONTROLS = {
    "presence_penalty": LogitControls(presence_penalty=1.5),
    "frequency_penalty": LogitControls(frequency_penalty=0.6),
    "repetition_penalty": LogitControls(repetition_penalty=3.0),
    "logit_bias": LogitControls(logit_bias=((40, 2.0), (41, -100.0))),
    "min_tokens": LogitControls(min_tokens=5, logit_bias=((EOS, 100.0),)),  # EOS at once but for min_tokens
    "stop_token_ids": LogitControls(stop_token_ids=(12, 22, 25)),  # what rows 0, 3 and 5 repeat
    "all": LogitControls(0.5, 0.3, 1.5, 0.0, 3, (145, 280), ((40, 0.2), (EOS, -2.0))),
}


def test_plain_decoding_follows_each_controls_definition(model, target):
    uncontrolled = _plain(target, None)
    for name, c in CONTROLS.items():
        tokens = _plain(target, c)
        assert tokens != uncontrolled, name
        for prompt, row in zip(PROMPTS, tokens, strict=True):
            output: list[int] = []
            for token in row:
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + output])).logits[0, -1]
                assert token == int(_reference_controls(logits, c, prompt, output, {EOS}).argmax()), name
                output.append(token)
            ended = row[-1] == EOS or row[-1] in c.stop_token_ids
            assert ended or len(row) == NEW_TOKENS, name
            assert EOS not in row[: c.min_tokens] and not set(c.stop_token_ids) & set(row[: c.min_tokens]), name
    assert [len(r) for r in _plain(target, CONTROLS["min_tokens"])] == [6] * len(PROMPTS)  # EOS the 6th
    assert [len(r) for r in _plain(target, CONTROLS["stop_token_ids"])] == [1, 16, 16, 1, 16, 1, 16, 16]


@pytest.fixture(scope="module")
def models(model, target, tiny_model_dir) -> registry.Models:
    """Every optional model: a draft that is the target itself (drafts accepted, several slots a
    verify), heads, an EAGLE head and exits of random weights."""
    exits = untrained_exits(model, [1], adapter_rank=4)
    same = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    return registry.Models(
        target,
        draft=same,
        heads=tiny_heads(target, tiny_model_dir),
        eagle=tiny_eagle(target, tiny_model_dir),
        exits=exits.double().eval().requires_grad_(False),
    )


def _drafted(name: str, models: registry.Models, controls, prompts, params=None):
    options = StrategyOptions(name=name, num_speculative_tokens=4, adaptive=name == "auto")
    options.self_speculative.exit_layer = 1  # the tiny target has two layers
    controller = AdaptiveController() if name == "auto" else None
    return registry.create(options, models, controller).generate(_requests(controls, prompts), params or _params())


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_every_lossless_drafter_emits_plain_decodings_tokens_under_each_control(target, models, prompts):
    for control, c in CONTROLS.items():
        reference = _plain(target, c, prompts)
        for name in LOSSLESS:
            out = _drafted(name, models, c, prompts)
            assert [r.tokens for r in out.rows] == reference, (control, name)


def test_rows_of_one_batch_keep_their_own_controls(target, models):
    per_row = [*CONTROLS.values(), None]
    alone = [_plain(target, c, [p])[0] for c, p in zip(per_row, PROMPTS, strict=True)]
    assert _plain(target, per_row) == alone
    for name in ("speculative", "eagle", "auto"):
        assert [r.tokens for r in _drafted(name, models, per_row, PROMPTS).rows] == alone, name


def test_drafts_of_the_controlled_continuation_are_accepted_whole(target):
    """Drafts right about the controlled output pass every slot only when slot j is controlled with the
    draft's first j tokens as output: a slot controlled with the row's output alone would reject them."""
    c = CONTROLS["all"]
    reference = _plain(target, c)
    proposer = ScriptedProposer(reference, target.vocab_size)
    strategy = SpeculativeStrategy("scripted", target, [DraftingMethod("scripted", proposer, 4, 4, ExactMatch())])
    out = strategy.generate(_requests(c), _params())
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["accepted_tokens"] == out.stats["draft_tokens"] > 0


def test_sampled_rows_keep_their_keyed_samples_under_controls(target, models):
    params = _params(temperature=0.5, seed=3)  # the tiny model's logits are flat: min_p drops tokens at 0.5
    for c in (LogitControls(min_p=0.6), CONTROLS["all"], LogitControls(min_p=0.3, repetition_penalty=2.0)):
        reference = _plain(target, c, params=params)
        assert reference != _plain(target, None, params=params)
        for name in ("prompt_lookup", "lookahead", "eagle", "auto"):  # exact matching of keyed samples
            assert [r.tokens for r in _drafted(name, models, c, PROMPTS, params).rows] == reference, name

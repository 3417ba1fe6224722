"""CALM's exited tokens are the exit head's choice at the exit layer, not the final layer's.

A threshold every exit reaches sends each token (after the prefill's) out at `min_layer`. The layers
up to the exit run in full for every token, so the state there is the plain forward's hidden state
after that many layers, and the exit head over it names the token. Checked by hand: with the exited
rows' tokens taken from the final layer instead (in `CalmStrategy._step`, every row's state run to
the last layer and read by the target's head), every case below fails; the existing tests, which
look at exit depths and at thresholds no exit reaches, still passed.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model
from test_early_exit import LAYERS, trained_like_exits
from transformers import AutoModelForCausalLM

from strategies.base import GenerationParams, RowRequest
from strategies.decoders.calm import CalmStrategy
from strategies.methods.calm import CalmOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [13], [14, 15, 16, 14]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-4-layers"), seed=2, layers=LAYERS)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def target(model):
    return ModelRunner(model)


def _layer_choices(model, exits, tokens: list[int], layer: int) -> tuple[int, int]:
    """(the exit head's argmax after `layer` layers, the final layer's) for the token after `tokens`."""
    with torch.inference_mode():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    at_exit = exits.logits(layer, out.hidden_states[layer][0, -1])
    return int(at_exit.argmax()), int(out.logits[0, -1].argmax())


@pytest.mark.parametrize("measure", ["softmax", "gap", "state", "classifier"])
@pytest.mark.parametrize("layer", [1, LAYERS - 1])
def test_every_exited_token_is_the_exit_heads_choice_at_its_layer(model, target, measure, layer):
    exits = trained_like_exits(model, classifier=True)
    calm = CalmStrategy(target, exits, CalmOptions(threshold=1e-9, measure=measure, min_layer=layer))
    params = GenerationParams(8, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    rows = calm.generate([RowRequest(prompt=p, key=i) for i, p in enumerate(PROMPTS)], params).rows
    differs = 0
    for prompt, row in zip(PROMPTS, rows, strict=True):
        assert row.columns["mean_exit_layer"] == (LAYERS + layer * (len(row.tokens) - 1)) / len(row.tokens)
        for i in range(1, len(row.tokens)):
            at_exit, at_final = _layer_choices(model, exits, prompt + row.tokens[:i], layer)
            assert row.tokens[i] == at_exit, (prompt, i)
            differs += at_exit != at_final
    assert differs > 0  # the exit's choice is not the final layer's somewhere: the check has teeth

"""A drafter that reads the target's features starts with its batch, whenever it is first planned."""

from __future__ import annotations

import pytest
import torch
from mixed_prompts import PROMPTS
from test_eagle import _params, _tokens, tiny_eagle
from transformers import AutoModelForCausalLM

from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.proposers.eagle import EagleProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.target_states import TargetStates
from strategies.verification.control import AUTOREGRESSIVE, Plan
from strategies.verification.drafting import DraftingMethod
from strategies.verification.speculative import SpeculativeStrategy

DEPTH = 3


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


class PlainThenEagle(AdaptiveController):
    """Plain steps until `first_draft`, then EAGLE every step."""

    def __init__(self, first_draft: int):
        super().__init__()
        self.first_draft, self.planned = first_draft, 0

    def plan(self, batch_size):
        self.planned += 1
        if self.planned < self.first_draft:
            return Plan(AUTOREGRESSIVE, 0, 0)
        return Plan("eagle", DEPTH, DEPTH)


class FirstRoots(EagleProposer):
    """Keeps each row's context and the root feature its first draft grew from."""

    def _feed_target_features(self):
        root = super()._feed_target_features()
        if not hasattr(self, "first"):
            self.first = [(list(row.context), root[b].clone()) for b, row in enumerate(self.rows)]
        return root


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS[:3]], ids=["batch1", "batch3"])
def test_a_features_drafter_started_mid_batch_drafts_what_it_drafts_when_started_with_the_batch(
    target, tiny_model_dir, prompts
):
    """First planned after 6 plain steps, the head's cache holds the prompt's features and every plain
    step's, as a head fed the whole context at once does: its first draft grows from the same root."""
    params = _params(16)
    head = tiny_eagle(target, tiny_model_dir)
    proposer = FirstRoots(head, top_k=1)
    method = DraftingMethod("eagle", proposer, DEPTH, DEPTH)
    strategy = SpeculativeStrategy("auto", target, [method], controller=PlainThenEagle(first_draft=7))
    assert _tokens(strategy, prompts, params) == _tokens(AutoregressiveStrategy(target), prompts, params)
    for context, root in proposer.first:
        assert any(
            context[: len(p)] == p and len(context) == len(p) + 7 for p in prompts
        )  # 6 plain steps and the prefill's
        with torch.inference_mode():
            hidden = target.prefill(target.new_kv(1), [context[:-1]], want_hidden=True).hidden  # [1, L, H]
            fresh = EagleProposer(head, 1)
            fresh.start([context], params, TargetStates(hidden, [list(range(len(context) - 1))]))
            assert torch.allclose(fresh._feed_target_features()[0], root, atol=1e-9)

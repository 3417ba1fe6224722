"""`auto` at temperature > 0 samples what plain decoding samples: by default it drafts sampled rows only
with candidates whose rule emits the target's keyed samples (`strategy.reproducible_sampling`), so the
drafter it picks by timing cannot change a row's tokens. A rejection-sampling candidate (the draft model,
self-speculation) is exact in distribution only, and is allowed with `reproducible_sampling=false`,
which the manifest then names.

Checked by hand: with every drafter live at temperature > 0 (the `keyed_samples` test in
`SpeculativeStrategy._samples` dropped), the first test fails: the draft model's rejection sampling
changes the sampled tokens.
"""

from __future__ import annotations

import pytest
import torch
from mixed_prompts import PROMPTS
from transformers import AutoModelForCausalLM

from pipeline.lossy import unreproducible_sampling
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.control import AUTOREGRESSIVE, Plan

SAMPLED = GenerationParams(20, SamplingParams(temperature=0.8, top_k=40, seed=7), frozenset(), ignore_eos=True)


class EveryDrafterInTurn(AdaptiveController):
    """Plans each drafter it may plan in turn, the draft model first: whatever timing would choose.
    `offered`: the drafters the loop let it plan."""

    def start_batch(self, limits, batch_size):
        super().start_batch(limits, batch_size)
        self.offered = set(limits)

    def plan(self, batch_size):
        names = sorted(self.limits, reverse=True)  # speculative, prompt_lookup, lookahead
        if not names:
            return Plan(AUTOREGRESSIVE, 0, 0)
        self.turn = getattr(self, "turn", -1) + 1
        name = names[self.turn % len(names)]
        return Plan(name, self.limits[name].max_depth, self.limits[name].max_nodes)


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_draft_dir):
    target = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    draft = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_draft_dir, dtype=torch.float64))
    return registry.Models(target, draft=draft)


def _auto(models, reproducible: bool):
    options = StrategyOptions(name="auto", candidates=["speculative", "prompt_lookup"])
    options.reproducible_sampling = reproducible
    controller = EveryDrafterInTurn()
    return registry.create(options, models, controller), controller


def _requests():
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(PROMPTS)]


def test_sampled_rows_under_auto_are_the_targets_keyed_samples_whichever_drafter_runs(models):
    reference = [r.tokens for r in AutoregressiveStrategy(models.target).generate(_requests(), SAMPLED).rows]
    strategy, controller = _auto(models, reproducible=True)
    out = strategy.generate(_requests(), SAMPLED)
    assert [r.tokens for r in out.rows] == reference
    assert controller.offered == {"prompt_lookup"} and "speculative" not in out.stats["verify_steps"]
    assert out.stats["faults"] == {}


def test_rejection_sampling_candidates_draft_sampled_rows_only_when_allowed(models):
    strategy, controller = _auto(models, reproducible=False)
    allowed = strategy.generate(_requests(), SAMPLED)
    assert controller.offered == {"speculative", "prompt_lookup"}
    assert allowed.stats["verify_steps"].get("speculative", 0) > 0 and allowed.stats["faults"] == {}
    greedy = GenerationParams(20, SamplingParams(), frozenset(), ignore_eos=True)
    strategy, controller = _auto(models, reproducible=True)
    out = strategy.generate(_requests(), greedy)  # greedy rows: every candidate
    assert controller.offered == {"speculative", "prompt_lookup"} and out.stats["verify_steps"]["speculative"] > 0


def test_the_manifest_names_auto_when_its_samples_may_not_reproduce():
    options = StrategyOptions(name="auto")
    assert unreproducible_sampling(options) == {}
    options.reproducible_sampling = False
    reason = unreproducible_sampling(options)["auto"]
    assert "speculative" in reason and "self_speculative" in reason and "prompt_lookup" not in reason
    assert "exact in distribution" in reason and "not reproducible" in reason
    options.candidates = ["prompt_lookup", "eagle"]  # both emit the target's keyed samples
    assert unreproducible_sampling(options) == {}
    assert unreproducible_sampling(StrategyOptions(name="speculative")) == {}  # a fixed strategy is one drafter

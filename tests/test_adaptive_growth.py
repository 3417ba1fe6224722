"""How far the controller may grow drafts (`strategy.adaptive_growth`): the configured sizes are where it
starts and what a strategy without it drafts; the bounds are those sizes grown."""

from __future__ import annotations

import pytest
import torch
from test_eagle import tiny_eagle
from transformers import AutoModelForCausalLM

from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.control.controller import AdaptiveController
from strategies.methods.spec import grown
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.control import Plan


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def test_a_bound_is_the_configured_size_times_the_growth_rounded_up_never_below_it():
    assert grown(4, StrategyOptions()) == 8  # the default growth, 2
    assert grown(5, StrategyOptions(adaptive_growth=1.5)) == 8
    assert grown(8, StrategyOptions(adaptive_growth=1.0)) == 8
    assert grown(0, StrategyOptions()) == 0


def test_a_growth_below_one_is_refused_naming_its_key():
    found = registry.problems(StrategyOptions(name="speculative", adaptive_growth=0.5), greedy=True)
    assert any(p.startswith("strategy.adaptive_growth") and ">= 1" in p for p in found), found
    assert not [
        p for p in registry.problems(StrategyOptions(adaptive_growth=1.0), greedy=True) if "adaptive_growth" in p
    ]


def _limits(options: StrategyOptions, models: registry.Models) -> dict:
    strategy = registry.create(options, models, AdaptiveController())
    return {name: d.limits() for name, d in strategy.drafters.items()}


def test_each_drafter_is_bounded_by_its_grown_size_and_starts_at_the_configured_one(runner, tiny_model_dir):
    """Kills a drafter built at its configured size as its bound (the controller could never grow it), or
    started at its bound: a chain's depth, a tree's node budget (EAGLE's static tree, Lookahead's)."""
    models = registry.Models(runner, eagle=tiny_eagle(runner, tiny_model_dir), draft=runner)
    options = StrategyOptions(name="auto", candidates=["speculative", "eagle", "lookahead"])
    limits = _limits(options, models)
    assert (limits["speculative"].max_depth, limits["speculative"].start_depth) == (8, 4)
    assert (limits["eagle"].max_nodes, limits["eagle"].start_nodes, limits["eagle"].max_depth) == (16, 8, 5)
    assert (limits["lookahead"].max_nodes, limits["lookahead"].start_nodes) == (16, 8)
    c = AdaptiveController()
    c.start_batch(limits, 1)
    assert (c.depth["speculative"], c.nodes["eagle"], c.nodes["lookahead"]) == (4, 8, 8)
    same = _limits(StrategyOptions(name="auto", candidates=["eagle"], adaptive_growth=1.0), models)
    assert (same["eagle"].max_nodes, same["eagle"].start_nodes) == (8, 8)


@pytest.mark.parametrize("name", ["speculative", "eagle", "lookahead"])
def test_a_strategy_without_the_controller_drafts_its_configured_size(runner, tiny_model_dir, name):
    """Kills the fixed loop planning a drafter's bound instead of its configured size
    (`strategy.adaptive=false`: the bench's fixed contenders), and its tokens differing from greedy."""
    models = registry.Models(runner, eagle=tiny_eagle(runner, tiny_model_dir), draft=runner)
    strategy = registry.create(StrategyOptions(name=name, adaptive=False), models, None)
    drafter = strategy.drafters[name]
    nodes = {"speculative": 4, "eagle": 8, "lookahead": 8}[name]
    depth = {"speculative": 4, "eagle": 5, "lookahead": 8}[name]
    assert strategy._plan({name: drafter}, 1) == Plan(name, depth, nodes)
    params = GenerationParams(16, SamplingParams(), frozenset(), ignore_eos=True)
    requests = [RowRequest([5, 6, 7, 5, 6], 0), RowRequest([9, 10], 1)]
    greedy = registry.create(StrategyOptions(), models, None).generate(requests, params)
    out = strategy.generate(requests, params)
    assert [r.tokens for r in out.rows] == [r.tokens for r in greedy.rows]

"""The registry's declarations: losslessness from the acceptance rule, `auto`'s refusal of lossy
candidates, the models each strategy needs and the output columns strategies declare."""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
import pytest

from strategies import registry
from strategies.methods.chain import CMLM_DRAFTER, DRAFT_MODEL, DRAFTERS
from strategies.methods.jacobi import JACOBI_INITS, JACOBI_MODES
from strategies.methods.lookahead import LOOKAHEAD_MODES
from strategies.options import StrategyOptions
from strategies.proposers.cmlm_proposer import CMLMProposer
from strategies.proposers.draft_model import DraftModelProposer
from strategies.proposers.jacobi import JacobiProposer
from strategies.proposers.lookahead import LookaheadProposer
from strategies.verification.acceptance import ACCEPTORS
from strategies.verification.rules import AcceptanceRule, ExactMatch, RejectionSampling, Relaxed, Typical
from workers.common.contract import OUTPUT_SCHEMA


def _rules(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_rules(sub))]


def test_every_acceptance_rule_declares_whether_it_is_lossless():
    declared = {rule: rule.__dict__["lossless"] for rule in _rules(AcceptanceRule)}
    assert declared == {ExactMatch: True, RejectionSampling: True, Relaxed: False, Typical: False}


def test_every_acceptance_rule_has_its_function():
    assert set(ACCEPTORS) == set(_rules(AcceptanceRule))


def test_a_rule_that_does_not_say_whether_it_is_lossless_cannot_be_defined():
    with pytest.raises(TypeError, match="must declare `lossless") as refused:

        class Undeclared(AcceptanceRule):
            name: ClassVar[str] = "undeclared"

    assert str(refused.value).endswith(
        "in its class body: True only if every token it emits is the target's own choice"
    )

    with pytest.raises(TypeError, match="must declare `lossless"):

        class Inherited(ExactMatch):  # a subclass may change the math: it says again
            name: ClassVar[str] = "inherited"


def _options(name: str, **nested: dict) -> StrategyOptions:
    options = StrategyOptions(name=name)
    for section, values in nested.items():
        for key, value in values.items():
            setattr(getattr(options, section), key, value)
    return options


_LOSSY = [
    (_options("autoregressive"), False),
    (_options("speculative"), False),
    (_options("speculative", speculative={"drafter": "cmlm"}), False),
    (_options("specdec"), True),
    (_options("specdec", specdec={"drafter": "cmlm"}), True),
    (_options("prompt_lookup"), False),
    (_options("lookahead"), False),
    (_options("medusa"), False),
    (_options("medusa", medusa={"acceptance": "typical"}), True),
    (_options("blockwise"), False),
    (_options("blockwise", blockwise={"top_k": 3}), True),
    (_options("jacobi"), False),
    (_options("eagle"), False),
    (_options("eagle", eagle={"tree": "chain"}), False),
    (_options("self_speculative"), False),
    (_options("calm"), True),
    (_options("mask_predict"), True),
    (_options("auto"), False),
]


@pytest.mark.parametrize(("options", "lossy"), _LOSSY)
def test_each_strategy_is_lossy_exactly_when_its_rule_or_loop_is(options, lossy):
    assert (registry.lossy_reason(options.name, options) is not None) == lossy


def test_every_strategy_is_among_the_cases_above():
    assert {options.name for options, _ in _LOSSY} == set(registry.available())


def test_auto_refuses_lossy_candidates_unless_the_key_allows_them():
    options = StrategyOptions(name="auto", candidates=["prompt_lookup", "specdec", "medusa"])
    options.medusa.acceptance = "typical"
    [problem] = registry.problems(options, greedy=True)
    assert "['specdec', 'medusa'] are lossy" in problem and "strategy.allow_lossy_candidates=true" in problem
    assert registry.lossy_reason("auto", options) is not None
    options.allow_lossy_candidates = True
    assert registry.problems(options, greedy=True) == []
    reason = registry.lossy_reason("auto", options)
    assert "specdec:" in reason and "medusa:" in reason and "prompt_lookup" not in reason
    lossless = StrategyOptions(name="auto", candidates=["prompt_lookup", "lookahead"])
    assert registry.problems(lossless, greedy=True) == [] and registry.lossy_reason("auto", lossless) is None


def test_default_auto_candidates_are_the_lossless_ones_whose_models_exist():
    typical = StrategyOptions(name="auto")
    typical.medusa.acceptance, typical.blockwise.top_k = "typical", 2
    assert registry.auto_candidates(typical, {"heads"}) == ["prompt_lookup", "lookahead", "jacobi"]  # cheapest first


def test_models_needed_come_from_the_proposer_each_option_picks():
    assert registry.models_needed(StrategyOptions(name="speculative")) == {"draft"}
    assert registry.models_needed(_options("speculative", speculative={"drafter": "cmlm"})) == {"cmlm"}
    assert registry.models_needed(_options("specdec", specdec={"drafter": "cmlm"})) == {"cmlm"}
    assert registry.models_needed(StrategyOptions(name="blockwise")) == {"heads"}
    assert registry.models_needed(StrategyOptions(name="calm")) == {"exits"}
    assert registry.models_needed(StrategyOptions(name="prompt_lookup")) == set()
    assert registry.models_needed(StrategyOptions(name="auto", candidates=["medusa", "speculative"])) == {
        "heads",
        "draft",
    }
    assert registry.models_needed(StrategyOptions(name="auto")) == {"draft", "heads", "exits", "cmlm", "eagle"}
    for drafter in DRAFTERS:  # every drafter the options' help names is one the registry builds
        assert registry.problems(_options("speculative", speculative={"drafter": drafter}), greedy=True) == []


def test_only_the_named_strategys_refusals_apply_but_every_strategys_options_are_checked():
    assert registry.problems(StrategyOptions(name="specdec"), greedy=False) == [
        "strategy.name=specdec: relaxed verification relaxes greedy decoding: use generation.temperature=0"
    ]
    assert registry.problems(StrategyOptions(name="speculative"), greedy=False) == []
    bad = _options("prompt_lookup", jacobi={"block_size": 0})
    assert [p for p in registry.problems(bad, greedy=True) if p.startswith("strategy.jacobi")]


def test_output_columns_are_the_ones_strategies_declare():
    assert registry.output_columns() == {"mean_exit_layer": float, "iterations": int, "block_lengths": list[int]}
    assert OUTPUT_SCHEMA.names[-3:] == ["mean_exit_layer", "iterations", "block_lengths"]
    assert OUTPUT_SCHEMA.field("block_lengths").type == pa.list_(pa.int64())


def test_the_proposers_implement_what_the_method_options_offer():
    assert (JacobiProposer.MODES, JacobiProposer.INITS) == (JACOBI_MODES, JACOBI_INITS)
    assert LookaheadProposer.MODES == LOOKAHEAD_MODES
    assert (DraftModelProposer.name, CMLMProposer.name) == (DRAFT_MODEL.name, CMLM_DRAFTER.name)

"""Self-speculative decoding (Draft & Verify, Zhang et al. 2024): the target's first layers and an exit
head there draft, and the full target verifies by rejection sampling, reusing those layers' keys and
values (`proposers/self_speculative.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import Artifacts, DraftCost, DraftingSpec, Models, StrategySection, grown, need
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, RejectionSampling

NAME = "self_speculative"


@dataclass
class SelfSpeculativeOptions:
    exit_layer: int = option(
        3,
        "The draft is the target's first exit_layer layers and its exit head there (model.exits "
        "must have one); verification reuses those layers' keys and values.",
    )
    min_confidence: float = option(
        0.0,
        "A row's draft stops after a token whose exit probability is below this (Draft & Verify's "
        "adaptive draft length): unlikely tokens cost draft steps and verify width. 0: drafts run full length.",
    )


def acceptance(options: StrategySection) -> AcceptanceRule:
    return RejectionSampling()


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.self_speculative import SelfSpeculativeProposer

    k, o = options.num_speculative_tokens, options.self_speculative
    exits = need(models, "exits", NAME)
    proposer = SelfSpeculativeProposer(models.target, exits, o.exit_layer, o.min_confidence)
    bound = grown(k, options)
    return DraftingMethod(NAME, proposer, bound, bound, rule, start_depth=k)


def check(options: StrategySection) -> list[str]:
    ss = options.self_speculative
    return out_of_bounds(
        [
            ("strategy.self_speculative.exit_layer", ss.exit_layer, ss.exit_layer >= 1, ">= 1"),
            ("strategy.self_speculative.min_confidence", ss.min_confidence, 0 <= ss.min_confidence <= 1, "in [0, 1]"),
        ]
    )


def artifact_check(options: StrategySection, artifacts: Artifacts) -> list[str]:
    """An exit layer the local exits do not have."""
    found = artifacts.record("exits")
    layer = options.self_speculative.exit_layer
    if found is None or layer in found[1].layers:
        return []
    url, exits = found
    return [
        f"strategy.self_speculative.exit_layer={layer}: model.exits={url} has exits after layers {exits.layers}; "
        "use one of them"
    ]


SPEC = DraftingSpec(
    name=NAME,
    options=SelfSpeculativeOptions,
    cost=DraftCost.MODEL,
    needs=("exits",),
    rule=acceptance,
    drafting=drafting,
    check=check,
    artifact_check=artifact_check,
)

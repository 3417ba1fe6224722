"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a chain drafter proposes k tokens,
and the target keeps them by rejection sampling, so every token is the target's own draw. A drafter
without draft probabilities (the CMLM's argmax tokens) is verified exactly instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_option import option
from strategies.methods.chain import DRAFTERS, chain_drafter, check_drafter, chosen
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, ExactMatch, RejectionSampling

NAME = "speculative"


@dataclass
class SpeculativeOptions:
    drafter: str = option(
        "draft_model",
        f"One of {DRAFTERS}. draft_model: model.draft drafts k tokens, one forward each; cmlm: "
        "model.cmlm fills k masked tokens in one forward (verified exactly).",
    )


def needs(options: StrategySection) -> tuple[str, ...]:
    return (chosen(NAME, options).model,)


def acceptance(options: StrategySection) -> AcceptanceRule:
    return RejectionSampling() if chosen(NAME, options).draft_probabilities else ExactMatch()


def check(options: StrategySection) -> list[str]:
    return check_drafter(NAME, options)


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    return chain_drafter(NAME, options, models, rule)


SPEC = DraftingSpec(
    name=NAME,
    options=SpeculativeOptions,
    cost=DraftCost.MODEL,
    needs=needs,
    rule=acceptance,
    drafting=drafting,
    check=check,
)

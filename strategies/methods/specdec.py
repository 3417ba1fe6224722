"""SpecDec (Xia et al. 2023): a chain drafter proposes k tokens, and a token is kept where it is among
the target's top-β and its logit within a tolerance of the top-1's. Lossy unless β=1 and tolerance 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import out_of_bounds
from strategies.config_option import option
from strategies.methods.chain import DRAFTERS, chain_drafter, check_drafter, chosen
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, Relaxed

NAME = "specdec"


@dataclass
class SpecDecOptions:
    drafter: str = option(
        "draft_model",
        f"One of {DRAFTERS}. cmlm: SpecDec's own non-autoregressive drafter (model.cmlm), k tokens in "
        "one forward; draft_model: model.draft, one forward per token.",
    )
    top_beta: int = option(3, "SpecDec β: a draft token is acceptable if among the target's top-β tokens…")
    tolerance: float = option(
        1.0, "…and its target logit is within this gap of the top-1 logit (β=1, 0: exact greedy)."
    )


def needs(options: StrategySection) -> tuple[str, ...]:
    return (chosen(NAME, options).model,)


def acceptance(options: StrategySection) -> AcceptanceRule:
    return Relaxed(options.specdec.top_beta, options.specdec.tolerance)


def check(options: StrategySection) -> list[str]:
    sd = options.specdec
    return check_drafter(NAME, options) + out_of_bounds(
        [
            ("strategy.specdec.top_beta", sd.top_beta, sd.top_beta >= 1, ">= 1"),
            ("strategy.specdec.tolerance", sd.tolerance, sd.tolerance >= 0, ">= 0 (0 with top_beta=1: exact greedy)"),
        ]
    )


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    return chain_drafter(NAME, options, models, rule)


SPEC = DraftingSpec(
    name=NAME,
    options=SpecDecOptions,
    cost=DraftCost.MODEL,
    needs=needs,
    rule=acceptance,
    drafting=drafting,
    check=check,
)

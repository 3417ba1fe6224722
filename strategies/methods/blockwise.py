"""Blockwise parallel decoding (Stern et al. 2018): the heads' top-1 tokens as one chain, kept where
they are among the target's top-k (exact at k=1).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection, grown, need
from strategies.proposers.medusa_choices import chain_choices
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, ExactMatch, Relaxed

NAME = "blockwise"


@dataclass
class BlockwiseOptions:
    top_k: int = option(
        1,
        "Accept a drafted token when it is among the target's top-k. 1: exact (lossless); >1: lossy, greedy only.",
    )


def acceptance(options: StrategySection) -> AcceptanceRule:
    top_k = options.blockwise.top_k
    return Relaxed(top_k) if top_k > 1 else ExactMatch()


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.medusa import HeadsProposer

    heads = need(models, "heads", NAME)
    k = min(options.num_speculative_tokens, heads.num_heads)
    bound = min(grown(k, options), heads.num_heads)  # a head drafts one depth
    return DraftingMethod(NAME, HeadsProposer(NAME, heads, chain_choices(bound)), bound, bound, rule, start_depth=k)


def check(options: StrategySection) -> list[str]:
    top_k = options.blockwise.top_k
    return out_of_bounds([("strategy.blockwise.top_k", top_k, top_k >= 1, ">= 1 (1: exact)")])


SPEC = DraftingSpec(
    name=NAME,
    options=BlockwiseOptions,
    cost=DraftCost.HEADS,
    needs=("heads",),
    rule=acceptance,
    drafting=drafting,
    check=check,
)

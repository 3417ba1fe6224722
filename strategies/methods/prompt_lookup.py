"""Prompt lookup: drafts copied from the row's own text (`proposers/prompt_lookup.py`), verified exactly.
Lookahead drafts with it first (`strategy.lookahead.prompt_lookup_first`), as this section configures it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection
from strategies.proposers.draft_sizing import AcceptanceRecord, linear_step_costs
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule

if TYPE_CHECKING:
    from strategies.proposers.prompt_lookup import PromptLookupProposer

NAME = "prompt_lookup"
PROMPT_LOOKUP_SIZINGS = ("acceptance", "fixed")


@dataclass
class PromptLookupOptions:
    max_ngram: int = option(3, "Longest suffix n-gram looked up in the row's context.")
    min_ngram: int = option(1, "Shortest suffix n-gram tried before giving up.")
    max_speculative_tokens: int = option(
        10,
        "Longest draft (never below strategy.num_speculative_tokens). 10: the reference prompt-lookup "
        "decoding's draft length.",
    )
    sizing: str = option(
        "acceptance",
        f"One of {PROMPT_LOOKUP_SIZINGS}. acceptance: the batch's drafts are cut to the depth their "
        "kinds of match (in the row's own output or its prompt, n tokens long) have paid for, up to "
        "max_speculative_tokens; fixed: "
        "strategy.num_speculative_tokens, which the controller lengthens where drafts keep being accepted.",
    )
    draft_step_cost: float = option(
        1.35,
        "sizing=acceptance: a step drafting one token over a plain step, until the controller has "
        "measured it (always with strategy.adaptive=false). 1.35: batch 1 on a 2-core CPU (bench costs=true).",
    )
    draft_token_cost: float = option(
        0.07, "sizing=acceptance: each draft token more, over a plain step, until measured (as above)."
    )


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    """Copied text is accepted whole more often than a model's guesses. By acceptance, each draft may be
    up to `max_speculative_tokens` long and the proposer cuts it to what its kind of match pays for (k
    is then only the controller's first guess at its usual length); fixed, drafts start at k tokens and
    the controller may lengthen them where they keep being accepted."""
    k = options.num_speculative_tokens
    cap = max(k, options.prompt_lookup.max_speculative_tokens)
    return DraftingMethod(NAME, lookup_proposer(options, cap), cap, cap, rule, start_depth=k)


def lookup_proposer(options: StrategySection, cap: int) -> PromptLookupProposer:
    """Prompt lookup as `strategy.prompt_lookup` configures it, drafting at most `cap` tokens: the
    method's own proposer, and the first try of Lookahead's (`strategy.lookahead.prompt_lookup_first`)."""
    from strategies.proposers.prompt_lookup import PromptLookupProposer

    o = options.prompt_lookup
    return PromptLookupProposer(
        o.min_ngram,
        o.max_ngram,
        AcceptanceRecord() if o.sizing == "acceptance" else None,
        linear_step_costs(o.draft_step_cost, o.draft_token_cost, cap),
    )


def check(options: StrategySection) -> list[str]:
    pl = options.prompt_lookup
    return one_of("strategy.prompt_lookup.sizing", pl.sizing, PROMPT_LOOKUP_SIZINGS) + out_of_bounds(
        [
            ("strategy.prompt_lookup.min_ngram", pl.min_ngram, pl.min_ngram >= 1, ">= 1"),
            (
                "strategy.prompt_lookup.max_ngram",
                pl.max_ngram,
                pl.max_ngram >= pl.min_ngram,
                f">= strategy.prompt_lookup.min_ngram ({pl.min_ngram})",
            ),
            (
                "strategy.prompt_lookup.max_speculative_tokens",
                pl.max_speculative_tokens,
                pl.max_speculative_tokens >= 1,
                ">= 1",
            ),
            ("strategy.prompt_lookup.draft_step_cost", pl.draft_step_cost, pl.draft_step_cost > 0, "> 0"),
            ("strategy.prompt_lookup.draft_token_cost", pl.draft_token_cost, pl.draft_token_cost >= 0, ">= 0"),
        ]
    )


SPEC = DraftingSpec(name=NAME, options=PromptLookupOptions, cost=DraftCost.LOOKUP, drafting=drafting, check=check)

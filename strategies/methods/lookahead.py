"""Lookahead: draft trees from a trie of n-grams every row of an actor feeds (`proposers/lookahead.py`),
after prompt lookup's chain where it finds one, verified exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.prompt_lookup import lookup_proposer
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection, grown
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule

NAME = "lookahead"
LOOKAHEAD_MODES = ("hier", "one")


@dataclass
class LookaheadOptions:
    decoding_length: int = option(
        8,
        "Draft tree nodes verified per row and step (under the controller: where it starts, and up to "
        "strategy.adaptive_growth times it). 8: the fastest of 2, 4, 8 and 16 at batch 1 with the shipped "
        "target on a 2-core CPU (bench lookahead_nodes=[2,4,8,16]; docs/benchmarks.md): 16 gained τ but its "
        "wider verify cost more.",
    )
    branch_length: int = option(8, "Deepest draft branch (tokens a step can accept).")
    max_query_length: int = option(6, "Longest context suffix matched in the trie (longest match first).")
    mode: str = option("hier", "hier: a tree of the best continuations; one: one branch.")
    max_nodes: int = option(300_000, "Trie size cap per actor; beyond it output counts decay and prune.")
    own_prompt_weight: float = option(3.0, "Weight of a count from the row's own prompt vs other rows and outputs (1).")
    prompt_lookup_first: bool = option(
        True,
        "A row whose prompt lookup (strategy.prompt_lookup's n-grams and sizing) finds a draft worth "
        "its cost gets that chain, cut to branch_length, and the trie's best nodes around it up to "
        "decoding_length; the other rows the trie's tree alone. false: the trie alone.",
    )


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.lookahead import LookaheadProposer

    o = options.lookahead
    lookup = lookup_proposer(options, o.branch_length) if o.prompt_lookup_first else None
    nodes = grown(o.decoding_length, options)
    proposer = LookaheadProposer(
        nodes, o.branch_length, o.max_query_length, o.mode, o.max_nodes, o.own_prompt_weight, lookup
    )
    trees = proposer.drafts_trees
    return DraftingMethod(
        NAME, proposer, o.branch_length, nodes, rule, trees=trees, learns=True, start_nodes=o.decoding_length
    )


def check(options: StrategySection) -> list[str]:
    la = options.lookahead
    return one_of("strategy.lookahead.mode", la.mode, LOOKAHEAD_MODES) + out_of_bounds(
        [
            ("strategy.lookahead.decoding_length", la.decoding_length, la.decoding_length >= 1, ">= 1"),
            ("strategy.lookahead.branch_length", la.branch_length, la.branch_length >= 1, ">= 1"),
            ("strategy.lookahead.max_query_length", la.max_query_length, la.max_query_length >= 1, ">= 1"),
            ("strategy.lookahead.max_nodes", la.max_nodes, la.max_nodes >= 1, ">= 1"),
            ("strategy.lookahead.own_prompt_weight", la.own_prompt_weight, la.own_prompt_weight >= 0, ">= 0"),
        ]
    )


SPEC = DraftingSpec(name=NAME, options=LookaheadOptions, cost=DraftCost.LOOKUP, drafting=drafting, check=check)

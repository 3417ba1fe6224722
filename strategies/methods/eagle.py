"""EAGLE (Li et al. 2024): a head on the target's features drafts a chain or a tree
(`proposers/eagle.py`), verified exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection, grown, need
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule

NAME = "eagle"
EAGLE_TREES = ("dynamic", "static", "chain")


@dataclass
class EagleOptions:
    tree: str = option(
        "static",
        f"One of {EAGLE_TREES}. static: EAGLE-1's fixed tree, the `nodes` paths of ranks below top_k "
        "most likely under a fixed chance per rank (0.6 · 0.4^rank), every node of a depth expanded in one "
        "pass; dynamic: EAGLE-2's tree, grown top_k nodes wide by cumulative draft confidence and reranked "
        "to the node budget; chain: the head's top-1 token at each depth. static at 8 nodes: the fastest of "
        "the three at 8 and 16 nodes and batch 1, 8 and 32 with the shipped head "
        "(docs/performance.md, 'EAGLE's defaults').",
    )
    depth: int = option(5, "Deepest draft path: draft steps of the head per step.")
    top_k: int = option(4, "dynamic: children per expanded node, and nodes expanded per depth; static: ranks below it.")
    nodes: int = option(
        8,
        "dynamic, static: draft nodes verified per row and step (the controller starts here and may verify "
        "fewer where its cost model says a wide verify forward does not pay, or up to strategy.adaptive_growth "
        "times as many where a wider one does: the dynamic tree keeps the most confident, the static tree its "
        "first).",
    )


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.eagle import EagleProposer

    o, head = options.eagle, need(models, "eagle", NAME)
    card_tau = head.config.heldout_tau(o.tree)
    if o.tree == "chain":
        depth = grown(o.depth, options)
        proposer = EagleProposer(head, top_k=1)
        return DraftingMethod(NAME, proposer, depth, depth, rule, start_depth=o.depth, card_tau=card_tau)
    # The static tree's shape at the bound: a budget of n nodes grows and keeps its first n.
    nodes = grown(o.nodes, options)
    proposer = EagleProposer(head, o.top_k, nodes if o.tree == "static" else 0)
    return DraftingMethod(NAME, proposer, o.depth, nodes, rule, trees=True, start_nodes=o.nodes, card_tau=card_tau)


def check(options: StrategySection) -> list[str]:
    eg = options.eagle
    return one_of("strategy.eagle.tree", eg.tree, EAGLE_TREES) + out_of_bounds(
        [
            ("strategy.eagle.depth", eg.depth, eg.depth >= 1, ">= 1"),
            ("strategy.eagle.top_k", eg.top_k, eg.top_k >= 1, ">= 1"),
            ("strategy.eagle.nodes", eg.nodes, eg.nodes >= 1, ">= 1"),
        ]
    )


SPEC = DraftingSpec(
    name=NAME, options=EagleOptions, cost=DraftCost.HEADS, needs=("eagle",), drafting=drafting, check=check
)

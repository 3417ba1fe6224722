"""Jacobi decoding (Santilli et al. 2023): a block of guesses refined by the target's own forwards
until they reach its greedy fixed point (`proposers/jacobi.py`). Greedy rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import DraftCost, DraftingSpec, Models, StrategySection
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule

NAME = "jacobi"
JACOBI_MODES = ("pj", "pgj", "hgj")
JACOBI_INITS = ("pad", "repeat", "retrieval")


@dataclass
class JacobiOptions:
    mode: str = option(
        "pgj", "pj: the whole output is one block; pgj: blocks of block_size in turn; hgj: pgj then plain."
    )
    block_size: int = option(8, "Tokens guessed and refined together (pgj, hgj).")
    init: str = option(
        "retrieval", "First guess of an unseen position: pad (EOS id), repeat (last tokens), retrieval (lookup)."
    )


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.jacobi import JacobiProposer

    o = options.jacobi
    depth = models.target.max_context if o.mode == "pj" else o.block_size
    return DraftingMethod(NAME, JacobiProposer(o.mode, o.block_size, o.init), depth, depth, rule, greedy_only=True)


def check(options: StrategySection) -> list[str]:
    jc = options.jacobi
    return (
        one_of("strategy.jacobi.mode", jc.mode, JACOBI_MODES)
        + one_of("strategy.jacobi.init", jc.init, JACOBI_INITS)
        + out_of_bounds([("strategy.jacobi.block_size", jc.block_size, jc.block_size >= 1, ">= 1")])
    )


SPEC = DraftingSpec(name=NAME, options=JacobiOptions, cost=DraftCost.GUESSES, drafting=drafting, check=check)

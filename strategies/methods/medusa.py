"""Medusa (Cai et al. 2024): heads on the target's last state draft a tree of candidates
(`proposers/medusa.py`), verified exactly or by Medusa's typical acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.config_bounds import one_of, out_of_bounds
from strategies.config_option import option
from strategies.methods.spec import Artifacts, DraftCost, DraftingSpec, Models, StrategySection, need
from strategies.proposers.medusa_choices import check_choices
from strategies.verification.drafting import DraftingMethod
from strategies.verification.rules import AcceptanceRule, ExactMatch, Typical

NAME = "medusa"

# Medusa's default tree: 8 nodes over 3 heads, the paths of highest estimated acceptance first. Measured on
# a 2-core CPU against trees of 3, 5, 16 and 32 nodes: wider trees accept more per
# step (τ 2.15 at 8 nodes, 2.38 at 32) but a verify forward costs more per node than they gain.
MEDUSA_TREE = [[0], [0, 0], [1], [0, 0, 0], [2], [0, 1], [1, 0], [3]]
MEDUSA_ACCEPTANCE = ("exact", "typical")


@dataclass
class MedusaOptions:
    choices: list[list[int]] = option(
        MEDUSA_TREE,
        "Tree of candidates: paths of ranks, [0, 1] = top-1 of head 0, then top-2 of head 1 below it; "
        "most valuable first, each path after its prefix (a smaller node budget keeps the first ones).",
    )
    acceptance: str = option(
        "exact",
        f"One of {MEDUSA_ACCEPTANCE}. exact: lossless; typical: Medusa's typical rule (lossy at "
        "temperature > 0; exact matching at temperature 0, as Medusa's reference).",
    )
    typical_epsilon: float = option(0.09, "Typical acceptance ε: accept x when p(x) > min(ε, δ·exp(−H(p))).")
    typical_delta: float = option(0.3, "Typical acceptance δ (about √ε in the paper).")


def acceptance(options: StrategySection) -> AcceptanceRule:
    o = options.medusa
    return Typical(o.typical_epsilon, o.typical_delta) if o.acceptance == "typical" else ExactMatch()


def drafting(options: StrategySection, models: Models, rule: AcceptanceRule) -> DraftingMethod:
    from strategies.proposers.medusa import HeadsProposer

    o, heads = options.medusa, need(models, "heads", NAME)
    problem = check_choices(o.choices, heads.num_heads, models.target.vocab_size)
    if problem is not None:
        raise ValueError(f"strategy.medusa.choices: {problem}")
    depth = max(len(c) for c in o.choices)
    branching = len({tuple(c) for c in o.choices}) > depth
    return DraftingMethod(NAME, HeadsProposer(NAME, heads, o.choices), depth, len(o.choices), rule, trees=branching)


def check(options: StrategySection) -> list[str]:
    md = options.medusa
    found = one_of("strategy.medusa.acceptance", md.acceptance, MEDUSA_ACCEPTANCE) + out_of_bounds(
        [
            ("strategy.medusa.typical_epsilon", md.typical_epsilon, md.typical_epsilon > 0, "> 0"),
            ("strategy.medusa.typical_delta", md.typical_delta, md.typical_delta > 0, "> 0"),
        ]
    )
    if not md.choices:
        found.append("strategy.medusa.choices is empty: give at least one path, e.g. [[0]]")
    else:
        shape = check_choices(md.choices)  # the heads' depth and the vocabulary are checked as the heads load
        if shape is not None:
            found.append(f"strategy.medusa.choices: {shape}")
    return found


def artifact_check(options: StrategySection, artifacts: Artifacts) -> list[str]:
    """A path deeper than the local heads, or a rank beyond their vocabulary."""
    found = artifacts.record("heads")
    if found is None:
        return []
    url, heads = found
    problem = check_choices(options.medusa.choices, heads.num_heads, heads.vocab_size)
    return [] if problem is None else [f"strategy.medusa.choices: {problem} of model.heads={url}"]


SPEC = DraftingSpec(
    name=NAME,
    options=MedusaOptions,
    cost=DraftCost.HEADS,
    needs=("heads",),
    rule=acceptance,
    drafting=drafting,
    check=check,
    artifact_check=artifact_check,
)

"""A drafter as the speculative loop runs it: its proposer, its limits and the rule it is verified with.
Torch-free, as the method modules that build these are read by the job's driver (`strategies/methods/`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strategies.verification.control import DraftLimits
from strategies.verification.rules import AcceptanceRule, ExactMatch

if TYPE_CHECKING:
    from strategies.verification.proposer import Proposer


@dataclass
class DraftingMethod:
    """A drafting method: a proposer with the limits and acceptance rule of the strategy it serves,
    under the name the controller plans and the records count by."""

    name: str
    proposer: Proposer
    max_depth: int  # longest draft path (chain length)
    max_nodes: int  # most nodes per row (trees); chains: max_depth
    rule: AcceptanceRule = field(default_factory=ExactMatch)
    trees: bool = False  # it drafts trees (several children below a node), not only chains
    greedy_only: bool = False  # off at temperature > 0: those rows decode plainly (Jacobi's fixed point is greedy)
    learns: bool = False  # it learns from every batch it sees (a Lookahead trie), drafting or not
    # Chain length without a controller, and its first under one; None: max_depth. A proposer that sizes
    # its own drafts is asked for max_depth, and this is the controller's first guess at its usual length.
    start_depth: int | None = None
    # A tree's node budget without a controller, and its first under one; None: max_nodes.
    start_nodes: int | None = None
    card_tau: float | None = None  # τ its model's card records on held-out text (`DraftLimits.card_tau`)

    def limits(self) -> DraftLimits:
        """What the controller may plan of it (`control.DraftLimits`)."""
        p = self.proposer
        return DraftLimits(
            self.max_depth,
            self.max_nodes,
            self.trees,
            self.start_depth,
            self.start_nodes,
            p.drafts_per_depth,
            p.sizes_own_drafts,
            self.learns,
            self.card_tau,
        )

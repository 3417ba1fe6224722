"""What the speculative loop asks its controller each step, and what it reports back.

The controller is a policy fed by measurements (`strategies.control.controller.AdaptiveController`); this
module only fixes the vocabulary, so strategies stay free of the policy and testable without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

AUTOREGRESSIVE = "autoregressive"


@dataclass
class Plan:
    """How to decode the next step of a batch."""

    drafter: str  # a drafter's name, or AUTOREGRESSIVE for a plain step
    depth: int  # deepest draft path to ask for
    nodes: int  # most draft nodes per row (trees)
    rows_off: set[int] = field(default_factory=set)  # batch rows that take a plain step anyway
    # Plain plans: steps to take before asking again (fewer if a row finishes); None: until one does.
    steps: int | None = 1
    # A drafter that sizes its own drafts: a step drafting k = 1..depth tokens over a plain step, by the
    # cost model (`ProposalContext.step_costs`); None: not modelled at this batch size yet.
    step_costs: list[float] | None = None


@dataclass(frozen=True)
class DraftLimits:
    """What a drafter may be asked for, as its drafter says: the controller sizes drafts within them."""

    max_depth: int  # longest draft path (chain length)
    max_nodes: int  # most nodes per row; a chain's are its depth
    trees: bool = False  # it drafts trees (node budgets double or halve), not chains (depth moves)
    start_depth: int | None = None  # a chain's length before the controller sizes it; None: max_depth
    start_nodes: int | None = None  # a tree's node budget before the controller sizes it; None: max_nodes
    per_depth: bool = False  # its drafting runs a model once per draft depth (`Proposer.drafts_per_depth`)
    sizes_own: bool = False  # it sizes its drafts itself (`Proposer.sizes_own_drafts`): ask for max_depth
    learns: bool = False  # it learns from what every row emits, drafting or not (a Lookahead trie)
    # τ its model's card records on held-out text (EAGLE's `heldout_acceptance`); None: none recorded.
    # It orders exploration only (`Exploration._explore_rank`): every choice rests on steps measured here.
    card_tau: float | None = None

    @property
    def first_nodes(self) -> int:
        """A tree's node budget before the controller sizes it, and without a controller."""
        return self.max_nodes if self.start_nodes is None else self.start_nodes


@dataclass
class StepRecord:
    """What one step cost and gained."""

    drafter: str
    batch_size: int
    wall_s: float
    drafted: list[int]  # per row: draft tokens verified
    accepted: list[int]  # per row: draft tokens accepted
    width: int = 1  # new tokens per row in the step's target forward (padded): 1 + the widest draft
    forward_s: float | None = None  # the forward's time until its tokens were on the host; None: not timed
    # Starting the drafter for this batch and its rows' one-time setup (a draft model's prefill, a trie's
    # prompts): not in `wall_s`, which is what its steps cost from then on, but paid all the same.
    setup_s: float = 0.0
    # New tokens per row the forward computed (`Verification.computed_width`): a ragged grid whose
    # padding was left out of the matmuls costs what a full grid that narrow costs; None: `width`.
    computed_width: int | None = None


class Controller(Protocol):
    def start_batch(self, drafters: dict[str, DraftLimits], batch_size: int) -> None:
        """A new batch; `drafters` maps each available drafter to its limits."""

    def plan(self, batch_size: int) -> Plan: ...

    def worth_learning(self, drafter: str, batch_size: int) -> bool:
        """Whether a drafter that learns from every batch should see this one, even if it may not draft."""

    def observe(self, record: StepRecord) -> None: ...

    def drafter_failed(self, drafter: str, reason: str) -> None:
        """The drafter raised: it is off for the rest of the batch."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only these batch rows remain (per-row state follows them)."""

    def add_rows(self, count: int) -> None:
        """`count` rows join the batch after those there (continuous batching), with no history."""

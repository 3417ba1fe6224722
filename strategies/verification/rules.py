"""Acceptance rules as a strategy declares them: a name, whether the rule is lossless, its parameters,
and the sampling and draft shapes its math does not cover (`refusal`). The registry reads these to
say whether a strategy is lossless and whether it can decode a job's rows, in the driver, before any
model loads; the functions that apply a rule to a verify forward are `strategies.verification.acceptance`'s
(`accept`). Each rule class declares `lossless`: a drafting strategy is lossless exactly when its rule
is (`strategies.methods.spec.DraftingSpec`), so a new rule cannot slip into `auto`'s defaults or out of the manifest's
`lossy` without saying which it is.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


class AcceptanceRule(ABC):
    """A rule of the verifier. `lossless`: every token it emits is the target's own (greedy: its argmax;
    sampling: a draw from its distribution), whatever was drafted. Required of every rule class: one
    that does not declare it in its own body fails when it is defined. `keyed_samples`: at temperature
    > 0 it emits exactly the target's keyed samples, the tokens plain decoding draws for the row, so a
    rerun samples the same tokens whichever drafter decoded the row (exact in distribution is not
    enough: rejection sampling draws its own uniforms against the draft's probabilities)."""

    name: ClassVar[str]
    lossless: ClassVar[bool]
    keyed_samples: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("lossless"), bool):
            raise TypeError(
                f"acceptance rule {cls.__name__} must declare `lossless: ClassVar[bool] = ...` in its class body: "
                "True only if every token it emits is the target's own choice"
            )

    @abstractmethod
    def refusal(self, greedy: bool, trees: bool) -> str | None:
        """Why this rule cannot verify such drafts (tree drafts or not) at this sampling, or None."""


@dataclass(frozen=True)
class ExactMatch(AcceptanceRule):
    """The target's own choice decides (`tree_walks.walk`, run as `walk_rows`): lossless for any draft, chain or
    tree, greedy or sampled. Greedy, the argmax is taken only at the slots the walk reaches."""

    name: ClassVar[str] = "exact"
    lossless: ClassVar[bool] = True
    keyed_samples: ClassVar[bool] = True

    def refusal(self, greedy: bool, trees: bool) -> str | None:
        return None


@dataclass(frozen=True)
class RejectionSampling(AcceptanceRule):
    """Speculative sampling of chains drafted with probabilities (`acceptance.rejection_chains`); greedy: `walk`.

    A draft without probabilities counts as one-hot q (accepted with probability p(x)).
    """

    name: ClassVar[str] = "rejection_sampling"
    lossless: ClassVar[bool] = True

    def refusal(self, greedy: bool, trees: bool) -> str | None:
        if trees and not greedy:
            return (
                "rejection sampling verifies chains: testing several children against one p repeats "
                "chances and biases the output; verify trees with exact matching instead"
            )
        return None


@dataclass(frozen=True)
class Relaxed(AcceptanceRule):
    """SpecDec's relaxed verification, and blockwise decoding's top-k (`tolerance` infinite): greedy only."""

    top_beta: int
    tolerance: float = math.inf
    name: ClassVar[str] = "relaxed"
    lossless: ClassVar[bool] = False

    def refusal(self, greedy: bool, trees: bool) -> str | None:
        return None if greedy else "relaxed verification relaxes greedy decoding: use generation.temperature=0"


@dataclass(frozen=True)
class Typical(AcceptanceRule):
    """Medusa's typical acceptance (`tree_walks.typical_walk`) at temperature > 0, on the target's probabilities
    after temperature and filtering, then the target's keyed sample; at temperature 0 exact matching,
    as the reference's (see `acceptance`'s docstring for where it differs)."""

    epsilon: float
    delta: float
    name: ClassVar[str] = "typical"
    lossless: ClassVar[bool] = False

    def refusal(self, greedy: bool, trees: bool) -> str | None:
        return None

"""Sizing a batch's drafts by how drafts of their kinds have fared, against what a draft costs.

A lookup drafter knows more about each draft than the controller does: a long match in the row's
own output (a loop the model has fallen into) is accepted almost always, a one-token match in the
prompt seldom. So it keeps, per kind of draft, how often the j-th token was accepted when the ones
before it were, and drafts the depth k with the most tokens per unit of time:

    (1 + P(a >= 1) + ... + P(a >= k)) / cost(k)

where a is the accepted length (each P the mean over the batch's rows: every row pays the forward's
width) and cost(k) what a step drafting k tokens costs, in plain steps (cost(0) = 1: no draft, a
plain-width forward). The costs are the controller's
cost model where it has one (`ProposalContext.step_costs`). The controller's chain sizing is the
same rule with P(a >= j) = alpha^j (`workers.cost_model.best_chain_depth`).

Where the forward leaves a ragged grid's padding out of its matmuls, a row pays its own tokens, and
a step computing as many slots as a full grid 1 + K wide costs cost(K) (`Verification.computed_width`,
what the controller measures): at each K the step holds the rows × K likeliest draft tokens of the
whole batch, and rows draft unequally (`AcceptanceRecord.row_depths`). At 8 rows a prompt lookup
step had drafted every row to the depth its mean paid for, most rows' tokens unlikely, or none.

Only positions that were verified are counted (a token after a rejected one says nothing), and a
kind starts from a prior of `prior_accepted` in `prior_tried`, so an unseen kind is tried.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate


def linear_step_costs(first: float, per_token: float, depth: int) -> list[float]:
    """cost(k) for k = 1..depth, in plain steps: `first` for a one-token draft, `per_token` more for each more."""
    return [first + per_token * (k - 1) for k in range(1, depth + 1)]


def best_length(survival: Sequence[float], step_costs: Sequence[float], plain_cost: float | None = 1.0) -> int:
    """The draft length k with the most tokens per unit of cost, (1 + sum(survival[:k])) / step_costs[k - 1],
    the shortest of equals. survival[j - 1] = P(a >= j); k runs to the shorter of the two lists. With
    `plain_cost` (in the costs' unit), k = 0 competes at 1 token for that cost; None: k >= 1."""
    best, best_rate = (0, 1.0 / plain_cost) if plain_cost is not None else (1, -1.0)
    tokens = 1.0
    for k, (p, cost) in enumerate(zip(survival, step_costs, strict=False), start=1):
        tokens += p
        if tokens / cost > best_rate:
            best, best_rate = k, tokens / cost
    return best


@dataclass
class AcceptanceRecord:
    """Per kind of draft, per position j (1-based): verified, and accepted, counts."""

    prior_accepted: float = 1.0
    prior_tried: float = 2.0
    probe_every: int = 16  # a kind refused this many steps running drafts once, so that it can recover
    tried: dict[Hashable, list[int]] = field(default_factory=dict)
    accepted: dict[Hashable, list[int]] = field(default_factory=dict)
    refused: dict[Hashable, int] = field(default_factory=dict)

    def record(self, kind: Hashable, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens of `kind` had its first `accepted` accepted."""
        verified = min(accepted + 1, drafted)  # the positions up to the first rejection
        tried, hits = self._counts(kind, verified)
        for j in range(verified):
            tried[j] += 1
            hits[j] += j < accepted

    def survival(self, kind: Hashable, depth: int) -> list[float]:
        """P(a >= j) for j = 1..depth: the product of the conditional acceptances up to j."""
        tried, hits = self.tried.get(kind, []), self.accepted.get(kind, [])
        survival, p = [], 1.0
        for j in range(depth):
            seen, kept = (tried[j], hits[j]) if j < len(tried) else (0, 0)
            p *= (kept + self.prior_accepted) / (seen + self.prior_tried)
            survival.append(p)
        return survival

    def depth(self, drafts: Sequence[tuple[Hashable, int]], rows: int, step_costs: Sequence[float]) -> int:
        """The draft depth K of a step over `rows` rows, `drafts` holding (kind, tokens available) of
        those that found a draft. Every row pays the forward's width, 1 + K, so K is chosen on the
        batch's mean tokens, and each row then drafts up to K: a token short of the width buys nothing.
        At batch 1 it is that row's best length."""
        depth = min(max((room for _, room in drafts), default=0), len(step_costs))
        if not depth:
            return 0
        mean = [0.0] * depth  # P(a >= j), summed over the rows' drafts, over all rows
        curves = self._curves(drafts, depth)
        for kind, room in drafts:
            for j, p in enumerate(curves[kind][: min(room, depth)]):
                mean[j] += p / rows
        chosen = best_length(mean, step_costs, None if self._probing(drafts) else 1.0)
        self._refusals({kind: chosen > 0 for kind, _ in drafts})
        return chosen

    def row_depths(self, drafts: Sequence[tuple[Hashable, int] | None], step_costs: Sequence[float]) -> list[int]:
        """Per row of a step, its draft depth, `drafts` holding each row's (kind, tokens available), None
        where it found none, when each row pays its own tokens (module docstring): a step of K takes
        the rows × K draft tokens likeliest to be accepted, each row's in order (P(a >= j) falls with j),
        and the K with the most tokens per cost wins; the smaller of equals, none where no K beats a
        plain step. At batch 1 it is `depth`."""
        rows, found = len(drafts), [d for d in drafts if d is not None]
        limit = min(max((room for _, room in found), default=0), len(step_costs))
        if not limit:
            return [0] * rows
        curves = self._curves(found, limit)
        tokens = [  # (P(a >= j), j, row)
            (p, j, row)
            for row, draft in enumerate(drafts)
            if draft is not None
            for j, p in enumerate(curves[draft[0]][: min(draft[1], limit)])
        ]
        tokens.sort(key=lambda t: (-t[0], t[1], t[2]))  # likeliest first, so each row's in order of depth
        expected = list(accumulate(p for p, _, _ in tokens))
        taken, best_rate = (0, 1.0) if not self._probing(found) else (None, -1.0)
        for k in range(1, limit + 1):
            count = min(rows * k, len(tokens))
            rate = (rows + expected[count - 1]) / (rows * step_costs[k - 1])
            if rate > best_rate:
                taken, best_rate = count, rate
            if count == len(tokens):  # deeper steps hold no more tokens
                break
        depths = [0] * rows
        for _, _, row in tokens[:taken]:
            depths[row] += 1
        drafted: dict[Hashable, bool] = {}
        for draft, d in zip(drafts, depths, strict=True):
            if draft is not None:
                drafted[draft[0]] = drafted.get(draft[0], False) or d > 0
        self._refusals(drafted)
        return depths

    def _curves(self, drafts: Sequence[tuple[Hashable, int]], depth: int) -> dict[Hashable, list[float]]:
        """P(a >= j) for j = 1..depth of each kind among `drafts`."""
        return {kind: self.survival(kind, depth) for kind in {kind for kind, _ in drafts}}

    def _probing(self, drafts: Sequence[tuple[Hashable, int]]) -> bool:
        """Whether a kind among `drafts` has been refused `probe_every` steps running: this step drafts."""
        return any(self.refused.get(kind, 0) + 1 >= self.probe_every for kind, _ in drafts)

    def _refusals(self, drafted: dict[Hashable, bool]) -> None:
        """Count a step's refusals: per kind, whether a row of that kind drafted."""
        for kind, any_drafted in drafted.items():
            self.refused[kind] = 0 if any_drafted else self.refused.get(kind, 0) + 1

    def _counts(self, kind: Hashable, depth: int) -> tuple[list[int], list[int]]:
        tried, hits = self.tried.setdefault(kind, []), self.accepted.setdefault(kind, [])
        if len(tried) < depth:
            tried.extend([0] * (depth - len(tried)))
            hits.extend([0] * (depth - len(hits)))
        return tried, hits

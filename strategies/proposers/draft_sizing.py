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
same rule with P(a >= j) = alpha^j (`strategies.control.cost_model.best_chain_depth`).

Only positions that were verified are counted (a token after a rejected one says nothing), and a
kind starts from a prior of `prior_accepted` in `prior_tried`, so an unseen kind is tried.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


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
        curves: dict[Hashable, list[float]] = {}
        for kind, room in drafts:
            if kind not in curves:
                curves[kind] = self.survival(kind, depth)
            for j, p in enumerate(curves[kind][: min(room, depth)]):
                mean[j] += p / rows
        probe = any(self.refused.get(kind, 0) + 1 >= self.probe_every for kind, _ in drafts)
        chosen = best_length(mean, step_costs, None if probe else 1.0)
        for kind, _ in drafts:
            self.refused[kind] = 0 if chosen else self.refused.get(kind, 0) + 1
        return chosen

    def _counts(self, kind: Hashable, depth: int) -> tuple[list[int], list[int]]:
        tried, hits = self.tried.setdefault(kind, []), self.accepted.setdefault(kind, [])
        if len(tried) < depth:
            tried.extend([0] * (depth - len(tried)))
            hits.extend([0] * (depth - len(hits)))
        return tried, hits

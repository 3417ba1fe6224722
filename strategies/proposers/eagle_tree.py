"""EAGLE's draft trees: EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858), grown by confidence
then reranked, and EAGLE-1's static tree (arXiv 2401.15077), one fixed shape for every step.

A node's value is its path's cumulative draft confidence: the sum of the draft's log-probabilities
along the path from the pending token, an estimate of the chance that the target accepts the whole
path. Growing: the root's `top_k` best tokens are depth 1; at each depth the `top_k` nodes of highest
value are expanded (the frontier), each into its own `top_k` best children, so the tree widens where
the draft is sure and stays thin where it is not. Reranking: of every node grown, the `max_nodes` of
highest value are verified. A child's value is never above its parent's (log-probabilities are at
most 0), and ties keep the parent first, so the nodes kept always include their ancestors. At
temperature 0 the reranking is on calibrated values instead (`calibrated_values`): a path's chance of
acceptance from how often the target accepted nodes of each depth and confidence bin once their parent
was accepted (`Calibration`, fed by `verdicts` on each draft), the raw confidence until a bin has
verdicts. Growing keeps the paper's rule.

A chain is the tree with `top_k` = 1. The static tree is a fixed list of paths of ranks, as Medusa's
(`[0, 1]`: the top-1 token below the pending one, then the top-2 below it): `static_tree` picks the
`nodes` paths of highest prior chance, where a token of rank r is accepted with the fixed chance
`static_rank_prior`(r) whatever it follows, so the shape is long down the top-1 path and bushy near
the root. Growing it expands every node of one depth that has children in one call; a smaller node
budget keeps the shape's first nodes (`first_nodes`), whatever the draft's confidence.

The functions here are pure: the distributions come from a callable (`Expand`), which the proposer
backs with its head and the tests with literal tables.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from strategies.verification.drafts import Draft

# (frontier tokens [B, F], each one's parent's index in the previous frontier [B, F] (-1: the root),
# depth of the frontier) -> log-probabilities of the token after each frontier node [B, F, V].
Expand = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass
class Grown:
    """Every node grown, per row, parents before children (a parent's index is smaller)."""

    tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N] index of the parent node, -1: the pending token
    values: torch.Tensor  # [B, N] cumulative log-confidence of the path
    depths: torch.Tensor  # [B, N] 1 for the pending token's children


def grow(root: torch.Tensor, depth: int, top_k: int, expand: Expand) -> Grown:
    """Grow a tree `depth` levels deep below each row's pending token, whose next-token
    log-probabilities are `root` [B, V]: the `top_k` best children of the `top_k` best nodes of each
    level (`expand` gives the distributions below a level's frontier)."""
    b = root.shape[0]
    values, tokens = root.topk(top_k, dim=-1)  # [B, k]
    parents = torch.full_like(tokens, -1)
    grown = [(tokens, parents, values, torch.ones_like(tokens))]
    frontier_tokens, frontier_values = tokens, values
    frontier_nodes = torch.arange(top_k, device=root.device).expand(b, top_k)  # [B, F] node indices
    frontier_parents = torch.full_like(tokens, -1)  # [B, F] index in the previous frontier
    count = top_k
    for level in range(2, depth + 1):
        log_probs = expand(frontier_tokens, frontier_parents, level - 1)  # [B, F, V]
        child_log_probs, child_tokens = log_probs.topk(top_k, dim=-1)  # [B, F, k]
        child_values = (frontier_values[..., None] + child_log_probs).flatten(1)  # [B, F k]
        child_tokens = child_tokens.flatten(1)
        child_parents = frontier_nodes.repeat_interleave(top_k, dim=1)  # [B, F k]
        grown.append((child_tokens, child_parents, child_values, torch.full_like(child_tokens, level)))
        # Stable: among equal values the earlier child (of the better parent, of higher rank) goes on.
        best = child_values.argsort(dim=-1, descending=True, stable=True)[:, :top_k]  # [B, k]
        frontier_tokens = child_tokens.gather(1, best)
        frontier_values = child_values.gather(1, best)
        frontier_parents = best // top_k
        frontier_nodes = count + best
        count += child_tokens.shape[1]
    return Grown(*(torch.cat(parts, dim=1) for parts in zip(*grown, strict=True)))


def rerank(grown: Grown, budgets: list[int], max_nodes: int) -> list[Draft]:
    """Per row, the `max_nodes` grown nodes of highest value no deeper than the row's budget (0: no
    draft), as a draft tree in the order grown (parents first)."""
    return drafts_of(grown, ranked_nodes(grown, budgets, max_nodes))


def ranked_nodes(
    grown: Grown, budgets: list[int], max_nodes: int, values: list[list[float]] | None = None
) -> list[list[int]]:
    """Per row, the indices (ascending) of the `max_nodes` grown nodes of highest value no deeper than the
    row's budget; `values` per row and node, each at most its parent's (`calibrated_values`), or the
    grown ones."""
    depths = grown.depths.tolist()
    values = grown.values.tolist() if values is None else values
    kept = []
    for row, budget in enumerate(budgets):
        fits = [n for n in range(len(depths[row])) if depths[row][n] <= budget]
        # Python's sort is stable: on equal values the node grown first (an ancestor) stays first.
        kept.append(sorted(sorted(fits, key=lambda n: -values[row][n])[:max_nodes]))
    return kept


def drafts_of(grown: Grown, kept: list[list[int]]) -> list[Draft]:
    """Per row, the draft tree of its `kept` nodes (`ranked_nodes`)."""
    tokens, parents = grown.tokens.tolist(), grown.parents.tolist()
    return [_draft(tokens[row], parents[row], nodes) for row, nodes in enumerate(kept)]


def _draft(tokens: list[int], parents: list[int], kept: list[int]) -> Draft:
    """The draft tree of the `kept` nodes (ascending, each one's parent kept before it)."""
    index = {node: i for i, node in enumerate(kept)} | {-1: -1}
    return Draft([tokens[n] for n in kept], [index[parents[n]] for n in kept])


def static_rank_prior(rank: int) -> float:
    """The chance a static tree's shape assumes for a drafted token of `rank` (0: the top-1), 0.6 · 0.4^r:
    about the shipped head's top-1 acceptance, and the rest falling geometrically with the rank."""
    return 0.6 * 0.4**rank


@dataclass(frozen=True)
class StaticLevel:
    """The nodes of one depth of a static tree, and how they hang below the previous depth."""

    slots: torch.Tensor  # [n] each node's parent's index in the previous depth's frontier (0 at depth 1)
    frontier: torch.Tensor  # [F] which of the n have children (their indices among the n): the next call's inputs
    top: int  # 1 + the highest rank of a node among its parent's children: the children a parent is ranked for
    # [n] slots · top + ranks: each node's place among its parents' ranked children laid side by side
    picks: torch.Tensor
    # [F] each frontier node's parent's index in the previous depth's frontier (-1 at depth 1: the root)
    frontier_parents: torch.Tensor


@dataclass(frozen=True)
class StaticTree:
    """A fixed draft tree: paths of ranks, each after its prefix, most likely first."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]  # per node, its parent's index; -1: the pending token
    levels: tuple[StaticLevel, ...]  # depth 1 first
    # [N] per node, its place among the levels' nodes laid side by side (depth 1 first): growing builds
    # each depth's nodes whole and puts them in the tree's order with one gather
    order: torch.Tensor
    depths: torch.Tensor  # [N] per node, its depth (1: the pending token's children)


@lru_cache(maxsize=64)
def static_tree(nodes: int, depth: int, top_k: int) -> StaticTree:
    """The `nodes` paths of highest prior chance (`static_rank_prior`, multiplied along the path) no
    deeper than `depth`, ranks below `top_k`; ties keep the shorter path, then the lower ranks. Each
    path's prefix comes before it (its chance is higher), so any first n nodes form a tree. Cached: a
    shape is built once per (nodes, depth, top_k)."""
    paths: list[tuple[int, ...]] = []
    heap = [(-static_rank_prior(r), 1, (r,)) for r in range(top_k)]  # (-chance, length, path)
    heapq.heapify(heap)
    while heap and len(paths) < nodes:
        negative_chance, length, path = heapq.heappop(heap)
        paths.append(path)
        if length < depth:
            for r in range(top_k):
                heapq.heappush(heap, (negative_chance * static_rank_prior(r), length + 1, (*path, r)))
    return _shape(tuple(paths))


def _shape(paths: tuple[tuple[int, ...], ...]) -> StaticTree:
    index = {path: n for n, path in enumerate(paths)}
    parents = tuple(index.get(path[:-1], -1) for path in paths)
    has_children = set(parents)
    levels, previous_frontier = [], {-1: 0}  # node -> its index in the frontier of its depth
    laid_out: list[int] = []  # the levels' nodes side by side, depth 1 first
    for level in range(1, max(map(len, paths)) + 1):
        nodes = [n for n, path in enumerate(paths) if len(path) == level]
        frontier = [i for i, n in enumerate(nodes) if n in has_children]
        slots = [previous_frontier[parents[n]] for n in nodes]
        ranks = [paths[n][-1] for n in nodes]
        top = 1 + max(ranks)
        levels.append(
            StaticLevel(
                slots=torch.tensor(slots),
                frontier=torch.tensor(frontier, dtype=torch.long),
                top=top,
                picks=torch.tensor([slot * top + rank for slot, rank in zip(slots, ranks, strict=True)]),
                frontier_parents=torch.tensor([slots[i] if level > 1 else -1 for i in frontier], dtype=torch.long),
            )
        )
        laid_out += nodes
        previous_frontier = {nodes[i]: f for f, i in enumerate(frontier)}
    place = {node: i for i, node in enumerate(laid_out)}
    order = torch.tensor([place[n] for n in range(len(paths))])
    return StaticTree(paths, parents, tuple(levels), order, torch.tensor([len(path) for path in paths]))


def grow_static(root: torch.Tensor, tree: StaticTree, expand: Expand) -> Grown:
    """The static `tree` below each row's pending token, whose next-token log-probabilities are `root`
    [B, V]: a node is its parent's child of its rank. `expand` is called once per depth that has
    children, on every node of it that has some. Each depth's nodes are taken in one gather from their
    parents' ranked children, and the whole tree put in order at the end: a step's host work is a few
    operations a depth, whatever the tree's shape."""
    b, device = root.shape[0], root.device
    tokens, values = [], []  # per depth: [B, n]
    log_probs, parent_values = root[:, None], root.new_zeros(b, 1)  # [B, F, V], [B, F]: the frontier's
    for level, shape in enumerate(tree.levels, start=1):
        picks, slots, frontier = (t.to(device) for t in (shape.picks, shape.slots, shape.frontier))
        top_log_probs, top_tokens = log_probs.topk(shape.top, dim=-1)  # [B, F, k]
        level_tokens = top_tokens.flatten(1).index_select(1, picks)  # [B, n]
        level_values = parent_values.index_select(1, slots) + top_log_probs.flatten(1).index_select(1, picks)
        tokens.append(level_tokens)
        values.append(level_values)
        if len(frontier):
            parents_in_frontier = shape.frontier_parents.to(device).expand(b, -1)
            log_probs = expand(level_tokens.index_select(1, frontier), parents_in_frontier, level)
            parent_values = level_values.index_select(1, frontier)
    order = tree.order.to(device)
    parents = torch.tensor(tree.parents, device=device).expand(b, -1)
    return Grown(
        torch.cat(tokens, dim=1).index_select(1, order),
        parents,
        torch.cat(values, dim=1).index_select(1, order),
        tree.depths.to(device).expand(b, -1),
    )


def first_nodes(grown: Grown, budgets: list[int], max_nodes: int) -> list[Draft]:
    """Per row, the first `max_nodes` nodes of a static tree no deeper than the row's budget (0: no draft)."""
    tokens, parents, depths = (t.tolist() for t in (grown.tokens, grown.parents, grown.depths))
    return [
        _draft(tokens[row], parents[row], [n for n, d in enumerate(depths[row]) if d <= budget][:max_nodes])
        for row, budget in enumerate(budgets)
    ]


@dataclass
class Calibration:
    """How often the target accepts a drafted node whose parent it accepted, by the node's depth and the
    head's confidence in it (its probability below its parent), learned from the verifier's verdicts at
    temperature 0. The head's raw confidences undervalue its guesses (a top-1 at 0.45 may be the target's
    choice nine times in ten): products of them undervalue deep paths, and the dynamic tree keeps bushy
    shallow nodes that are rejected where a deeper path would have been accepted."""

    bins: int = 10  # confidence bins of equal width
    prior: float = 4.0  # verdicts the raw confidence counts as in a bin: before any, the paper's rule
    counts: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (depth, bin) -> [accepted, offered]

    def _bin(self, confidence: float) -> int:
        return min(self.bins - 1, int(confidence * self.bins))

    def record(self, depth: int, confidence: float, accepted: bool) -> None:
        counts = self.counts.setdefault((depth, self._bin(confidence)), [0, 0])
        counts[0] += accepted
        counts[1] += 1

    def chance(self, depth: int, confidence: float) -> float:
        """The chance a node at `depth` of head confidence `confidence` is accepted once its parent is: its
        bin's acceptance, shrunk toward the confidence by `prior` verdicts (at most 1)."""
        accepted, offered = self.counts.get((depth, self._bin(confidence)), (0, 0))
        return (accepted + self.prior * confidence) / (offered + self.prior)


def calibrated_values(grown: Grown, calibration: Calibration) -> list[list[float]]:
    """Per row and grown node, the log of the calibrated chance that its whole path is accepted: the sum
    over the path of log `Calibration.chance`, each node's confidence its value less its parent's. Never
    above a parent's (a chance is at most 1), so the nodes `ranked_nodes` keeps include their ancestors."""
    values, parents, depths = grown.values.tolist(), grown.parents.tolist(), grown.depths.tolist()
    ranked = []
    for row_values, row_parents, row_depths in zip(values, parents, depths, strict=True):
        mine: list[float] = []
        for value, parent, depth in zip(row_values, row_parents, row_depths, strict=True):
            above, base = (row_values[parent], mine[parent]) if parent >= 0 else (0.0, 0.0)
            chance = calibration.chance(depth, math.exp(value - above))
            mine.append(base + math.log(max(chance, 1e-9)))
        ranked.append(mine)
    return ranked


# A drafted node as the verdicts need it: (its parent's index in the draft, -1: the pending token; its
# token; its depth; the head's confidence in it below its parent).
Offered = tuple[int, int, int, float]


def offered_nodes(grown: Grown, kept: list[list[int]]) -> list[list[Offered]]:
    """Per row, its draft's nodes (`ranked_nodes`' `kept`, in draft order) as `Offered`."""
    tokens, parents = grown.tokens.tolist(), grown.parents.tolist()
    values, depths = grown.values.tolist(), grown.depths.tolist()
    offered = []
    for row, nodes in enumerate(kept):
        index = {node: i for i, node in enumerate(nodes)} | {-1: -1}
        row_parents, row_values = parents[row], values[row]
        offered.append(
            [
                (
                    index[row_parents[n]],
                    tokens[row][n],
                    depths[row][n],
                    math.exp(row_values[n] - (row_values[row_parents[n]] if row_parents[n] >= 0 else 0.0)),
                )
                for n in nodes
            ]
        )
    return offered


def verdicts(offered: list[Offered], emitted: list[int]) -> list[tuple[int, float, bool]]:
    """(depth, confidence, accepted) of each node of a row's draft whose parent was accepted, from the
    tokens the row emitted after it (the accepted path, then the target's own token): at temperature 0
    the emitted token below an accepted node is the target's choice, and the child drafting it, if any,
    was accepted; its siblings were not. Nodes below a rejected one were never judged."""
    judged, parent = [], -1
    for token in emitted:
        children = [i for i, node in enumerate(offered) if node[0] == parent]
        match = next((i for i in children if offered[i][1] == token), None)
        judged += [(offered[i][2], offered[i][3], i == match) for i in children]
        if match is None:
            break
        parent = match
    return judged

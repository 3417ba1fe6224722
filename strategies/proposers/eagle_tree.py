"""EAGLE's draft trees: EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858), grown by confidence
then reranked, and EAGLE-1's static tree (arXiv 2401.15077), one fixed shape for every step.

A node's value is its path's cumulative draft confidence: the sum of the draft's log-probabilities
along the path from the pending token, an estimate of the chance that the target accepts the whole
path. Growing: the root's `top_k` best tokens are depth 1; at each depth the `top_k` nodes of highest
value are expanded (the frontier), each into its own `top_k` best children, so the tree widens where
the draft is sure and stays thin where it is not. Reranking: of every node grown, the `max_nodes` of
highest value are verified. A child's value is never above its parent's (log-probabilities are at
most 0), and ties keep the parent first, so the nodes kept always include their ancestors.

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
from collections.abc import Callable
from dataclasses import dataclass
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
    drafts = []
    tokens, parents, values, depths = (t.tolist() for t in (grown.tokens, grown.parents, grown.values, grown.depths))
    for row, budget in enumerate(budgets):
        fits = [n for n in range(len(tokens[row])) if depths[row][n] <= budget]
        # Python's sort is stable: on equal values the node grown first (an ancestor) stays first.
        kept = sorted(sorted(fits, key=lambda n: -values[row][n])[:max_nodes])
        drafts.append(_draft(tokens[row], parents[row], kept))
    return drafts


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

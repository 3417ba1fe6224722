"""EAGLE's draft trees: EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858), grown by confidence
then reranked, and EAGLE-1's static tree (arXiv 2401.15077), one fixed shape for every step.

A node's value is its path's cumulative draft confidence: the sum of the draft's log-probabilities
along the path from the pending token, an estimate of the chance that the target accepts the whole
path. Growing: the root's `top_k` best tokens are depth 1; at each depth the `top_k` nodes of highest
value are expanded (the frontier), each into its own `top_k` best children, so the tree widens where
the draft is sure and stays thin where it is not. Reranking: of every node grown, the `max_nodes` of
highest value are verified. A child's value is never above its parent's (log-probabilities are at
most 0), and ties keep the parent first, so the nodes kept always include their ancestors. At
temperature 0 both are on calibrated values instead (`calibrated_values`, `Calibration.score`): a path's
chance of acceptance from how often the target accepted nodes of each depth, rank among their siblings
and confidence bin once their parent was accepted (`Calibration`, fed by `verdicts` on each draft),
the static tree's chance by rank until there are verdicts. The head's top-1 is accepted far more often
than its confidence says, and its other guesses far less: on the paper's rule the tree spends its
budget on siblings. On the shipped head (48 sample prompts, batch 1, τ at 4 / 8 / 16 / 32 nodes):
calibrated by depth and confidence 3.66 / 4.40 / 4.87 / 5.16, by rank too 3.98 / 4.72 / 4.99 / 5.22,
the static tree 3.43 / 4.20 / 4.96 / 5.25 (docs/benchmarks.md, "EAGLE's trees calibrated by rank").

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
    ranks: torch.Tensor  # [B, N] its rank among its parent's children (0: the head's top-1 below it)


# (depth, the top_k children's log-probabilities below each frontier node, [B, F, k], in rank order) -> what
# each child adds to its path's score, [B, F, k]: the frontier of each depth is the children of best score.
Score = Callable[[int, torch.Tensor], torch.Tensor]


def grow(
    root: torch.Tensor, depth: int, top_k: int, expand: Expand, score: Score | None = None, keep: int | None = None
) -> Grown:
    """Grow a tree `depth` levels deep below each row's pending token, whose next-token
    log-probabilities are `root` [B, V]: the `top_k` best children of the `top_k` best nodes of each
    level (`expand` gives the distributions below a level's frontier), best by their paths' values, or
    by `score` summed along the path (`Calibration.score`: the nodes reranking would keep).

    `keep`: the nodes reranking will keep. A frontier node whose score is below the `keep`-th best of the
    nodes grown so far can have no kept descendant (a child's score is at most its parent's), so it is not
    expanded: where the draft is sure, the deeper levels expand one or two nodes instead of `top_k`, and a
    head pass costs by the nodes it feeds. The nodes kept are the same."""
    b = root.shape[0]
    values, tokens = root.topk(top_k, dim=-1)  # [B, k]
    parents = torch.full_like(tokens, -1)
    ranks = torch.arange(top_k, device=root.device).expand(b, top_k)  # [B, k]
    grown = [(tokens, parents, values, torch.ones_like(tokens), ranks)]
    frontier_tokens, frontier_values = tokens, values
    frontier_scores = values if score is None else score(1, values[:, None])[:, 0]  # [B, F]
    frontier_nodes = torch.arange(top_k, device=root.device).expand(b, top_k)  # [B, F] node indices
    frontier_parents = torch.full_like(tokens, -1)  # [B, F] index in the previous frontier
    scores = [frontier_scores]  # per level, every node's
    count = top_k
    for level in range(2, depth + 1):
        if keep is not None and count >= keep:
            floor = torch.cat(scores, dim=1).topk(keep, dim=1).values[:, -1:]  # [B, 1] the keep-th best
            live = int((frontier_scores >= floor).sum(dim=1).max())  # in the row that has the most
            if live == 0:
                break
            if live < frontier_scores.shape[1]:
                best = frontier_scores.argsort(dim=-1, descending=True, stable=True)[:, :live]  # [B, F']
                frontier_tokens, frontier_values, frontier_scores, frontier_nodes, frontier_parents = (
                    t.gather(1, best)
                    for t in (frontier_tokens, frontier_values, frontier_scores, frontier_nodes, frontier_parents)
                )
        log_probs = expand(frontier_tokens, frontier_parents, level - 1)  # [B, F, V]
        child_log_probs, child_tokens = log_probs.topk(top_k, dim=-1)  # [B, F, k]
        child_values = (frontier_values[..., None] + child_log_probs).flatten(1)  # [B, F k]
        added = child_log_probs if score is None else score(level, child_log_probs)
        child_scores = (frontier_scores[..., None] + added).flatten(1)  # [B, F k]
        scores.append(child_scores)
        child_tokens = child_tokens.flatten(1)
        child_parents = frontier_nodes.repeat_interleave(top_k, dim=1)  # [B, F k]
        child_ranks = ranks.repeat(1, child_log_probs.shape[1])  # [B, F k]
        grown.append((child_tokens, child_parents, child_values, torch.full_like(child_tokens, level), child_ranks))
        # Stable: among equal values the earlier child (of the better parent, of higher rank) goes on.
        best = child_scores.argsort(dim=-1, descending=True, stable=True)[:, :top_k]  # [B, k]
        frontier_tokens = child_tokens.gather(1, best)
        frontier_values = child_values.gather(1, best)
        frontier_scores = child_scores.gather(1, best)
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
    ranks: torch.Tensor  # [N] per node, its rank among its parent's children


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
    depths, ranks = torch.tensor([len(path) for path in paths]), torch.tensor([path[-1] for path in paths])
    return StaticTree(paths, parents, tuple(levels), order, depths, ranks)


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
        tree.ranks.to(device).expand(b, -1),
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
    """How often the target accepts a drafted node whose parent it accepted, by the node's depth, its rank
    among its parent's children and the head's confidence in it (its probability below its parent),
    learned from the verifier's verdicts at temperature 0. The head's raw confidences undervalue its
    top-1 guesses (a top-1 at 0.15 is the target's choice seven times in ten) and overvalue the others (a
    second at 0.15, once in twenty): products of them undervalue deep paths, and the paper's tree keeps
    bushy shallow nodes that are rejected where a deeper path would have been accepted. The rank is a bin
    of its own because a confidence says different things at different ranks: pooled, a bin's acceptance
    would rank a second guess at the top-1's rate.

    A bin's acceptance is shrunk toward a wider bin's (`log_chances`), and before any verdict a node's
    chance is the static tree's by rank (`static_rank_prior`), not its confidence: a new proposer drafts
    about EAGLE-1's shape until verdicts say otherwise, where the paper's rule would keep its worst trees for
    the steps it takes to learn (on eight HumanEval prompts, the whole of a short job's life)."""

    bins: int = 10  # confidence bins of equal width
    ranks: int = 3  # rank bins: the top-1, the second, and every rank below them together
    prior: float = 4.0  # verdicts the wider bin's acceptance counts as in a bin
    # (depth, rank bin, confidence bin) -> [accepted, offered]
    counts: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    # `counts` as tensors on the device the chances are asked on, built at the first look after new verdicts:
    # per rank [ranks, 2], per rank and confidence bin [ranks, bins, 2], per depth too [deepest + 2, ranks, bins, 2]
    _levels: tuple[torch.Tensor, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def record(self, depth: int, rank: int, confidence: float, accepted: bool) -> None:
        key = (depth, min(self.ranks - 1, rank), min(self.bins - 1, int(confidence * self.bins)))
        counts = self.counts.setdefault(key, [0, 0])
        counts[0] += accepted
        counts[1] += 1
        self._levels = None

    def log_chances(self, depths: torch.Tensor, ranks: torch.Tensor, log_confidences: torch.Tensor) -> torch.Tensor:
        """log of the chance that a node at each of `depths`, `ranks` (among its parent's children) and head
        log-confidences below its parent `log_confidences` (all of one shape) is accepted once its parent is:
        its bin's acceptance, shrunk by `prior` verdicts toward the wider bin's above it. float64."""
        if self._levels is None or self._levels[0].device != depths.device:
            deepest = max((depth for depth, _, _ in self.counts), default=0)
            # The row past the deepest stays empty: deeper nodes have no verdicts.
            table = torch.zeros(deepest + 2, self.ranks, self.bins, 2, dtype=torch.float64)
            if self.counts:
                depth, rank, confidence_bin = torch.tensor(list(self.counts)).unbind(1)
                table[depth, rank, confidence_bin] = torch.tensor(list(self.counts.values()), dtype=torch.float64)
            self._levels = tuple(t.to(depths.device) for t in (table.sum((0, 2)), table.sum(0), table))
        by_rank, by_bin, by_depth = self._levels
        confidences = log_confidences.double().exp()
        confidence_bins = (confidences * self.bins).long().clamp(max=self.bins - 1)
        ranks = ranks.clamp(max=self.ranks - 1)
        # Each level's acceptance shrunk toward the one above by `prior` verdicts: before any, the static tree's
        # chance by rank; then the rank's over every depth and confidence, the rank and confidence bin's over
        # every depth, and the bin's at this depth.
        chances = static_rank_prior(ranks.double())
        for counts in (
            by_rank[ranks],
            by_bin[ranks, confidence_bins],
            by_depth[depths.clamp(max=len(by_depth) - 1), ranks, confidence_bins],
        ):  # [..., 2]
            chances = (counts[..., 0] + self.prior * chances) / (counts[..., 1] + self.prior)
        return chances.clamp(min=1e-9).log()

    def score(self, depth: int, log_probs: torch.Tensor) -> torch.Tensor:
        """`grow`'s `Score`: `log_chances` of the children at `depth` whose head log-probabilities below their
        parents are `log_probs` [..., k], ranks 0 to k − 1 along the last dimension."""
        ranks = torch.arange(log_probs.shape[-1], device=log_probs.device).expand(log_probs.shape)
        depths = torch.full_like(ranks, depth)
        return self.log_chances(depths, ranks, log_probs).to(log_probs.dtype)


def calibrated_values(grown: Grown, calibration: Calibration) -> list[list[float]]:
    """Per row and grown node, the log of the calibrated chance that its whole path is accepted: the sum
    over the path of `Calibration.log_chances`, each node's confidence its value less its parent's. Never
    above a parent's (a chance is at most 1), so the nodes `ranked_nodes` keeps include their ancestors."""
    has_parent, parents = grown.parents >= 0, grown.parents.clamp(min=0)  # [B, N]
    above = torch.where(has_parent, grown.values.gather(1, parents), 0.0)
    chances = calibration.log_chances(grown.depths, grown.ranks, grown.values - above)  # [B, N]
    paths = chances
    for _ in range(int(grown.depths.max()) - 1):  # each pass adds one more ancestor's chance
        paths = chances + torch.where(has_parent, paths.gather(1, parents), 0.0)
    return paths.tolist()


# A drafted node as the verdicts need it: (its parent's index in the draft, -1: the pending token; its
# token; its depth; its rank among its parent's children grown; the head's confidence in it below its parent).
Offered = tuple[int, int, int, int, float]


def offered_nodes(grown: Grown, kept: list[list[int]]) -> list[list[Offered]]:
    """Per row, its draft's nodes (`ranked_nodes`' `kept`, in draft order) as `Offered`."""
    tokens, parents = grown.tokens.tolist(), grown.parents.tolist()
    values, depths, ranks = grown.values.tolist(), grown.depths.tolist(), grown.ranks.tolist()
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
                    ranks[row][n],
                    math.exp(row_values[n] - (row_values[row_parents[n]] if row_parents[n] >= 0 else 0.0)),
                )
                for n in nodes
            ]
        )
    return offered


def verdicts(offered: list[Offered], emitted: list[int]) -> list[tuple[int, int, float, bool]]:
    """(depth, rank, confidence, accepted) of each node of a row's draft whose parent was accepted, from the
    tokens the row emitted after it (the accepted path, then the target's own token): at temperature 0
    the emitted token below an accepted node is the target's choice, and the child drafting it, if any,
    was accepted; its siblings were not. Nodes below a rejected one were never judged."""
    judged, parent = [], -1
    for token in emitted:
        children = [i for i, node in enumerate(offered) if node[0] == parent]
        match = next((i for i in children if offered[i][1] == token), None)
        judged += [(*offered[i][2:], i == match) for i in children]
        if match is None:
            break
        parent = match
    return judged

"""EAGLE-2's dynamic draft tree (Li et al. 2024, arXiv 2406.16858): grow by confidence, then rerank.

A node's value is its path's cumulative draft confidence: the sum of the draft's log-probabilities
along the path from the pending token, an estimate of the chance that the target accepts the whole
path. Growing: the root's `top_k` best tokens are depth 1; at each depth the `top_k` nodes of highest
value are expanded (the frontier), each into its own `top_k` best children, so the tree widens where
the draft is sure and stays thin where it is not. Reranking: of every node grown, the `max_nodes` of
highest value are verified. A child's value is never above its parent's (log-probabilities are at
most 0), and ties keep the parent first, so the nodes kept always include their ancestors.

A chain is the tree with `top_k` = 1. The functions here are pure: the distributions come from a
callable (`Expand`), which the proposer backs with its head and the tests with literal tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
        index = {node: i for i, node in enumerate(kept)} | {-1: -1}
        drafts.append(Draft([tokens[row][n] for n in kept], [index[parents[row][n]] for n in kept]))
    return drafts

"""Draft trees: what every proposer returns and what the one verifier checks.

A draft for one row is a tree of proposed tokens hanging below the row's pending token (the last
token chosen, not yet in the cache). `parents[i]` is the index of node i's parent, -1 for the
pending token. A chain of k tokens is `parents = [-1, 0, 1, …, k-2]`. Nodes are listed parents
first (a parent's index is smaller than its children's), so depth and ancestry are one pass.

Verification feeds `[pending, node_0, …, node_{N-1}]` in one forward: slot 0 is the pending token,
slot i+1 is node i. Each slot sees the row's cache, its ancestors and itself (`tree_attention`), at
position `next_pos + depth` (`tree_depths`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class Draft:
    tokens: list[int]
    parents: list[int]  # -1: child of the pending token
    # Draft probabilities of the proposed tokens [N, V] (speculative sampling needs them); None for
    # deterministic drafts (lookup, trees).
    probs: torch.Tensor | None = None

    @staticmethod
    def chain(tokens: list[int], probs: torch.Tensor | None = None) -> Draft:
        return Draft(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)), probs=probs)

    @staticmethod
    def empty() -> Draft:
        return Draft(tokens=[], parents=[])

    def __len__(self) -> int:
        return len(self.tokens)


def draft_problem(draft: Draft, vocab_size: int, max_nodes: int, max_depth: int) -> str | None:
    """Why a proposer's draft cannot be verified as given, or None. Such a row takes an AR step.

    `max_nodes` bounds the verify forward's width; `max_depth` bounds the tokens a path can emit
    (the row's room before `max_new_tokens` or the context end).
    """
    if len(draft.tokens) != len(draft.parents):
        return "tokens and parents differ in length"
    if len(draft.tokens) > max_nodes:
        return f"{len(draft.tokens)} tokens, at most {max_nodes} allowed"
    if any(not 0 <= t < vocab_size for t in draft.tokens):
        return "token id outside the vocabulary"
    if any(not -1 <= p < i for i, p in enumerate(draft.parents)):
        return "a parent index does not precede its node"
    if draft.tokens and max(tree_depths(draft.parents)) > max_depth:
        return f"a branch deeper than the {max_depth} tokens the row can still emit"
    if draft.probs is not None and tuple(draft.probs.shape) != (len(draft.tokens), vocab_size):
        return f"probs of shape {tuple(draft.probs.shape)}, expected {(len(draft.tokens), vocab_size)}"
    return None


def is_chain(draft: Draft) -> bool:
    """True when every node's parent is the node before it."""
    return all(p == i - 1 for i, p in enumerate(draft.parents))


def merge_drafts(first: Draft, second: Draft, max_nodes: int) -> Draft:
    """One tree holding both drafts: every node of `first`, then the nodes of `second` in its order
    (a best-first tree's best first) while there is room for `max_nodes`. A node of `second` whose
    path is already in the tree is that node and takes no room; one whose parent found no room has none.
    Deterministic drafts only (no probabilities): one verify forward then checks both guesses."""
    tokens, parents = list(first.tokens), list(first.parents)
    node_of = {(parent, token): i for i, (token, parent) in enumerate(zip(tokens, parents, strict=True))}
    placed: dict[int, int] = {-1: -1}  # index in `second` -> index in the merged tree
    for j, (token, parent) in enumerate(zip(second.tokens, second.parents, strict=True)):
        if parent not in placed:
            continue
        key = (placed[parent], token)
        if key not in node_of:
            if len(tokens) >= max_nodes:
                continue
            node_of[key] = len(tokens)
            tokens.append(token)
            parents.append(key[0])
        placed[j] = node_of[key]
    return Draft(tokens, parents)


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each slot: 0 for the pending token, 1 for its children, … (length N + 1)."""
    depths = [0]
    for p in parents:
        depths.append(depths[p + 1] + 1)
    return depths


def tree_attention(parents: list[int], width: int) -> torch.Tensor:
    """[width, width] bool: slot i may see slot j (j is i, or an ancestor of i). Slots past the tree are
    padding (they see only themselves). Built once per tree shape (a Medusa tree repeats every step,
    as a trie's frequent ones do): the tensor is shared, to be read only."""
    return _tree_attention(tuple(parents), width)


@functools.lru_cache(maxsize=1024)
def _tree_attention(parents: tuple[int, ...], width: int) -> torch.Tensor:
    ancestry = [{slot} for slot in range(width)]  # built in Python: one small tensor op per node costs more
    for i, p in enumerate(parents):
        ancestry[i + 1] |= ancestry[p + 1]
    return torch.tensor([[j in seen for j in range(width)] for seen in ancestry], dtype=torch.bool)


def children_by_slot(draft: Draft) -> list[dict[int, int]]:
    """For each slot, its children's tokens mapped to their slots (first child wins on a repeated token)."""
    children: list[dict[int, int]] = [{} for _ in range(len(draft) + 1)]
    for i, (token, p) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        children[p + 1].setdefault(token, i + 1)
    return children

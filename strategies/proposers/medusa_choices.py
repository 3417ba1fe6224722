"""Medusa's `choices`: a tree of the heads' candidates as paths of ranks, (0, 1) being the top-1 of head
0 and below it the top-2 of head 1, listed most valuable first, each path after its prefix; and
blockwise decoding's chain of each head's top-1. Checked for a job's config before any model loads
(`strategies.proposers.medusa` drafts them).
"""

from __future__ import annotations

Path = tuple[int, ...]


def check_choices(choices: list[list[int]], num_heads: int | None = None, vocab_size: int | None = None) -> str | None:
    """Why `choices` cannot be a tree of these heads' candidates, or None. Without the heads (a job's
    config, checked before any model loads) only the tree's own shape is checked."""
    seen: set[Path] = set()
    for raw in choices:
        path = tuple(raw)
        if not path:
            return "an empty path (the root is the pending token, never a choice)"
        if num_heads is not None and len(path) > num_heads:
            return f"path {list(path)} is deeper than the {num_heads} heads"
        if any(rank < 0 for rank in path):
            return f"path {list(path)} has a negative rank (0 is a head's top-1)"
        if vocab_size is not None and any(rank >= vocab_size for rank in path):
            return f"path {list(path)} has a rank outside 0..{vocab_size - 1}"
        if path in seen:
            return f"path {list(path)} is listed twice"
        if len(path) > 1 and path[:-1] not in seen:
            return f"path {list(path)} comes before its prefix {list(path[:-1])}"
        seen.add(path)
    return None


def chain_choices(depth: int) -> list[list[int]]:
    """Each head's top-1, one below the other: blockwise decoding's draft."""
    return [[0] * d for d in range(1, depth + 1)]

"""Drafts cut to what the grammar allows, before the verify forward: a node the row's grammar refuses
can never be accepted (its slot's logit is -inf), and no slot below it can be masked (the matcher
cannot follow a path it refuses), so it and its subtree leave the draft.

One exception keeps rejection sampling exact: a draft drawn with probabilities (`Draft.probs`) keeps
its first refused node, as a leaf, so the rule rejects it and draws the correction from the target's
residual, as it would have; the node's own slot is never reached.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies.constraints.masks import Matcher, children
from strategies.verification.drafts import Draft


def kept_nodes(matcher: Matcher, draft: Draft) -> list[int]:
    """The nodes of `draft` whose path the grammar allows from where the row stands, in draft order
    (with probabilities: also each refused node whose parent is kept). The matcher ends where it began."""
    below, kept = children(draft), []
    leaf = draft.probs is not None

    def descend(parent: int) -> None:
        for node in below[parent]:
            if matcher.accepts(draft.tokens[node]):
                kept.append(node)
                matcher.advance(draft.tokens[node])
                descend(node)
                matcher.back(1)
            elif leaf:
                kept.append(node)

    descend(-1)
    return sorted(kept)


def subdraft(draft: Draft, nodes: list[int]) -> Draft:
    """The draft of `nodes` (sorted, each one's parent among them or -1), parents renumbered."""
    if len(nodes) == len(draft):
        return draft
    place = {old: new for new, old in enumerate(nodes)}
    parents = [place[draft.parents[n]] if draft.parents[n] >= 0 else -1 for n in nodes]
    probs = None if draft.probs is None else draft.probs[nodes]
    return Draft([draft.tokens[n] for n in nodes], parents, probs)


def prune(matchers: Sequence[Matcher | None], drafts: list[Draft]) -> list[Draft]:
    """Each constrained row's draft cut to the nodes its grammar allows (`kept_nodes`)."""
    if all(m is None for m in matchers):
        return drafts
    return [
        d if m is None or not len(d) else subdraft(d, kept_nodes(m, d)) for m, d in zip(matchers, drafts, strict=True)
    ]

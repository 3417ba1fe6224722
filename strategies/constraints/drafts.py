"""Grammars over drafts. A verify forward's slot j follows the row's output and the draft's path to node
j (`slot_masks`: a depth-first walk of the draft that advances the row's matcher down each path and
rolls it back). Drafts are cut to what the grammar allows before the verify forward: a node the row's
grammar refuses can never be accepted (its slot's logit is -inf), and no slot below it can be masked
(the matcher cannot follow a path it refuses), so it and its subtree leave the draft.

At temperature 0 acceptance reads only the slots down the path of each slot's choice, and only the
choice: `reached_masks` follows that path and masks a slot only where the grammar refuses its argmax,
a check of one token instead of a mask over the vocabulary at every slot.

One exception keeps rejection sampling exact: a draft drawn with probabilities (`Draft.probs`) keeps
its first refused node, as a leaf, so the rule rejects it and draws the correction from the target's
residual, as it would have; the node's own slot is never reached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strategies.constraints.masks import Matcher, apply, needs_mask, new_bitmasks
from strategies.verification.drafts import Draft, children_by_slot


def walk(matcher: Matcher, draft: Draft, allowed: Callable[[int], None], refused: Callable[[int], None]) -> None:
    """Visit the draft depth first from where the row stands: `allowed(node)` with the matcher advanced
    through the node's path (the node included), `refused(node)` for a node the grammar refuses there
    (its subtree is not visited). The matcher ends where it began."""
    below = children(draft)

    def descend(parent: int) -> None:
        for node in below[parent]:
            if matcher.accepts(draft.tokens[node]):
                matcher.advance(draft.tokens[node])
                allowed(node)
                descend(node)
                matcher.back(1)
            else:
                refused(node)

    descend(-1)


def kept_nodes(matcher: Matcher, draft: Draft) -> list[int]:
    """The nodes of `draft` whose path the grammar allows from where the row stands, in draft order
    (with probabilities: also each refused node whose parent is kept). The matcher ends where it began."""
    kept: list[int] = []
    walk(matcher, draft, kept.append, kept.append if draft.probs is not None else lambda node: None)
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


def with_forced(matchers: Sequence[Matcher | None], drafts: list[Draft], limits: Sequence[int]) -> list[Draft]:
    """At temperature 0: each constrained row whose grammar forces its next tokens (`Matcher.forced`)
    drafts them, as a chain of at most `limits[row]` tokens, unless its draft already holds that chain
    from its root; and a draft's main path (from the root, each node's first child: its drafter's best
    guess) goes on with what the grammar forces after it, within the row's limit. A forced token is
    the only text the grammar allows there, so the target's choice is almost always that token: a draft
    that costs a few microseconds and is accepted whole, where a drafter that never saw the format
    guesses a format's keys and punctuation poorly, and one that guessed a record's last value right
    would leave its closing brace and end to steps of their own. A row with a limit of 0 (the controller
    keeps it off) drafts nothing."""
    if all(m is None for m in matchers):
        return drafts
    out = []
    for matcher, draft, limit in zip(matchers, drafts, limits, strict=True):
        if matcher is None or limit <= 0:
            out.append(draft)
            continue
        forced = matcher.forced()[:limit]
        if forced and _depth_along(draft, forced) < len(forced):
            out.append(Draft.chain(forced))  # what the grammar forces after it, `forced` holds already
        else:
            out.append(_main_path_extended(matcher, draft, limit))
    return out


def _main_path_extended(matcher: Matcher, draft: Draft, limit: int) -> Draft:
    """`draft` with the tokens the grammar forces after its main path hung below that path's leaf, the
    path and them at most `limit` deep. The matcher ends where it began."""
    below, path, node = children(draft), [], -1
    while below[node]:
        node = below[node][0]
        path.append(node)
    if not path or len(path) >= limit or draft.tokens[path[-1]] in matcher.ends:
        return draft
    for node in path:
        matcher.advance(draft.tokens[node])
    forced = matcher.forced()[: limit - len(path)]
    matcher.back(len(path))
    if not forced:
        return draft
    first = len(draft)
    parents = [path[-1], *range(first, first + len(forced) - 1)]
    return Draft(draft.tokens + forced, draft.parents + parents)


def _depth_along(draft: Draft, path: list[int]) -> int:
    """How many tokens of `path` the draft holds, from its root down (as acceptance walks it)."""
    below, slot = children_by_slot(draft), 0
    for depth, token in enumerate(path):
        slot = below[slot].get(token)
        if slot is None:
            return depth
    return len(path)


def children(draft: Draft) -> list[list[int]]:
    """Per node, then last the pending token's: the nodes hanging below it."""
    below: list[list[int]] = [[] for _ in range(len(draft) + 1)]
    for node, parent in enumerate(draft.parents):
        below[parent].append(node)  # parent -1: the pending token's, the last list
    return below


def slot_masks(matcher: Matcher, draft: Draft, bitmasks: torch.Tensor) -> list[int]:
    """Fill `bitmasks` [1 + len(draft), words]: slot 0 what the grammar allows after the row's output,
    slot i + 1 what it allows after the draft's path to node i; the slots filled, in walk order. A node
    the grammar refuses, and its subtree, keep every token: their slots are never reached (the slot
    above refuses the node). The matcher ends where it began."""
    filled = [0]
    matcher.fill(bitmasks[0])

    def fill(node: int) -> None:
        matcher.fill(bitmasks[node + 1])
        filled.append(node + 1)

    walk(matcher, draft, fill, lambda node: None)
    return filled


def reached_masks(matcher: Matcher, draft: Draft, logits: torch.Tensor, best: Sequence[int]) -> dict[int, torch.Tensor]:
    """At temperature 0: the slots greedy acceptance reaches where the grammar refuses their argmax, each
    with its logits [V] masked. From slot 0, each slot's choice (its argmax `best[slot]` of `logits`
    [1 + len(draft), V], or the best token the grammar allows) leads to the child drafted with it (the
    first on a repeated token, as acceptance walks: `children_by_slot`), until there is none. Acceptance
    reads no other slot, so no other needs a mask. The matcher ends where it began."""
    below = children_by_slot(draft)
    slot, depth, masked = 0, 0, {}
    while True:
        choice = best[slot]
        if needs_mask(matcher, best, slot):
            bitmask = new_bitmasks(1, logits.shape[-1])
            matcher.fill(bitmask[0])
            masked[slot] = apply(logits[slot : slot + 1], [0], bitmask, [matcher.ends])[0]
            choice = int(masked[slot].max(dim=-1).indices)
        child = below[slot].get(choice)
        if child is None or not matcher.accepts(choice):  # a node kept for rejection sampling only
            break
        matcher.advance(choice)
        slot, depth = child, depth + 1
    matcher.back(depth)
    return masked


def draft_logits(
    logits: torch.Tensor, matchers: Sequence[Matcher | None], drafts: Sequence[Draft], greedy: bool = False
) -> torch.Tensor:
    """[B, W, V] a verify forward's logits with each constrained row's slots inside its grammar; `greedy`:
    only the slots greedy acceptance reaches, and of those only where the grammar refuses the argmax
    (`reached_masks`): every slot acceptance reads then chooses what the grammar allows."""
    b, w, v = logits.shape
    rows = [r for r, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    if greedy:
        best = logits[rows].max(dim=-1).indices.tolist()  # [R][W]: argmax, the first max
        masked = {
            (r, slot): row
            for r, row_best in zip(rows, best, strict=True)
            for slot, row in reached_masks(matchers[r], drafts[r], logits[r], row_best).items()
        }
        if not masked:
            return logits
        out = logits.clone()
        out[[r for r, _ in masked], [slot for _, slot in masked]] = torch.stack(list(masked.values()))
        return out
    slots, ends, blocks = [], [], []
    for r in rows:
        block = new_bitmasks(1 + len(drafts[r]), v)
        filled = slot_masks(matchers[r], drafts[r], block)
        slots += [r * w + s for s in filled]
        ends += [matchers[r].ends] * len(filled)
        blocks.append(block[filled])
    return apply(logits.reshape(b * w, v), slots, torch.cat(blocks), ends).view(b, w, v)

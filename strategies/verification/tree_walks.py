"""The tree walks: which path of one row's draft tree a verify forward accepts, from the target's
choices or probabilities at every slot (slot 0: the pending token; slot i+1: node i). Each ends in a
`Verdict`: the accepted nodes, then the one target token that follows them.

- `walk`: the target's own choice at each slot (its argmax, or its keyed sample); descend while a
  child carries that token. Greedy: exactly greedy decoding. Sampling: each emitted token is the
  target's sample at its position, whatever drafted the tree — lossless. `walk` is the
  specification; the verifier runs `walk_rows`, the same walk over every row at once, one level of
  the trees per pass, which asks for the target's choice only at the slots the walk reaches (on a
  CPU an argmax over the vocabulary at every slot of a wide batch's trees costs more than the rest
  of the step's host work together when the walk stops early). On a CPU each level's choices are
  read back and the rows descend in Python: a few dictionary lookups per row cost less than matching
  keys in tensor operations; on an accelerator the levels stay on the device, one read back per
  step.
- `relaxed_walk` (SpecDec; blockwise top-k): a child is accepted when it is among the target's
  top-β and its logit is within `tolerance` of the top-1 (β=1, tolerance 0: exactly greedy). Lossy.
- `typical_walk` (Medusa's typical acceptance): a child x at a slot with target distribution p is
  accepted when p(x) > min(ε, δ·exp(−H(p))); the longest accepted path wins, ties by Σ log p. Lossy.
  As the reference (FasterDecoding/Medusa, `evaluate_posterior` with `sampling='typical'`,
  `fast=True`): at temperature 0 it is exact matching (greedy decoding, lossless); H is computed as
  −Σ p·log(p + 1e-5). Where it differs, and why: p is the target's distribution after the job's
  top-k and top-p too (the reference's is softmax(z/T) alone), since those settings hold for every
  emitted token; and the token after the accepted path is the target's keyed sample there, not its
  argmax: with the argmax (and the acceptance deterministic), every sample of a row would be the same
  text and the seed would change nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from strategies.verification.drafts import Draft, children_by_slot, tree_depths


@dataclass
class Verdict:
    accepted_slots: list[int]  # accepted nodes as slots of the verify forward (node i is slot i+1), root to leaf
    tokens: list[int]  # accepted draft tokens, then the target's token


def walk(draft: Draft, chosen: list[int]) -> Verdict:
    """`chosen[slot]`: the target's token at each slot (length N + 1)."""
    children = children_by_slot(draft)
    slot, path = 0, []
    while (child := children[slot].get(chosen[slot])) is not None:
        path.append(child)
        slot = child
    return Verdict(accepted_slots=path, tokens=[draft.tokens[s - 1] for s in path] + [chosen[slot]])


KEY_STRIDE = 1 << 32  # a (parent slot, token) pair as one integer, parent_slot * KEY_STRIDE + token


@dataclass(frozen=True)
class DraftTable:
    """Every row's draft over the verify slots (slot 0: the pending token, slot i+1: node i), in the
    form each walk of `walk_rows` reads, made when first read."""

    drafts: list[Draft]
    device: torch.device
    depth: int  # the deepest node's depth over every row (0: no row drafted)

    @staticmethod
    def of(drafts: list[Draft], device: torch.device) -> DraftTable:
        depth = max((max(tree_depths(d.parents)) for d in drafts if len(d)), default=0)
        return DraftTable(drafts, device, depth)

    @functools.cached_property
    def children(self) -> list[list[dict[int, int]]]:
        """Per row, per slot: its children's tokens mapped to their slots (`children_by_slot`)."""
        return [children_by_slot(d) for d in self.drafts]

    @functools.cached_property
    def keys(self) -> torch.Tensor:
        """[B, W] each node's (parent slot, token) key; -1 where no walk goes: slot 0, padding, and a
        node with an earlier sibling of its token (the first child wins, as in `children_by_slot`)."""
        width = 1 + max(len(d) for d in self.drafts)
        keys = []
        for d in self.drafts:
            row, seen = [-1], set()
            for token, parent in zip(d.tokens, d.parents, strict=True):
                key = (parent + 1) * KEY_STRIDE + token
                row.append(-1 if key in seen else key)
                seen.add(key)
            keys.append(row + [-1] * (width - len(row)))
        return torch.tensor(keys, dtype=torch.long, device=self.device)


def walk_rows(
    drafts: list[Draft],
    table: DraftTable,
    choose: Callable[[torch.Tensor], torch.Tensor],
    stop_early: bool,
) -> list[Verdict]:
    """`walk` for every row at once, a level of the trees per pass. `choose(slots)`: the target's
    token at each row's slot `slots` [B] -> [B], asked once per level, of the slots the walk stands on.

    `stop_early` (the target's device is the host's): each level's choices are read back and the
    rows descend in Python, and the walk stops once no row descends, sparing the deeper levels'
    choices. A level costs a few dictionary lookups per row besides `choose`, where matching keys
    in tensors cost several tensor operations. Elsewhere reading back is a sync: every level runs on
    the device and the verdicts are the step's one read back. A row that stopped stands where it
    is: its choice there is asked again, the same.
    """
    if not stop_early:
        return _walk_rows_on_device(drafts, table, choose)
    children, device = table.children, table.device
    at = [0] * len(drafts)  # the slot each row stands on
    paths: list[list[int]] = [[] for _ in drafts]
    chosen = choose(torch.tensor(at, device=device)).tolist()
    for _ in range(table.depth):
        descended = False
        for row, (below, token) in enumerate(zip(children, chosen, strict=True)):
            child = below[at[row]].get(token)
            if child is not None:
                at[row] = child
                paths[row].append(child)
                descended = True
        if not descended:
            break
        chosen = choose(torch.tensor(at, device=device)).tolist()
    return [
        Verdict(accepted_slots=path, tokens=[d.tokens[s - 1] for s in path] + [token])
        for d, path, token in zip(drafts, paths, chosen, strict=True)
    ]


def _walk_rows_on_device(
    drafts: list[Draft], table: DraftTable, choose: Callable[[torch.Tensor], torch.Tensor]
) -> list[Verdict]:
    """`walk_rows` with every level on the device, keys matched in tensors; one read back at the end."""
    keys = table.keys  # [B, W]
    slots = torch.arange(keys.shape[1], device=keys.device)  # [W]
    at = torch.zeros(len(drafts), dtype=torch.long, device=keys.device)  # [B] the slot each row stands on
    stood = []  # per level: [B] where each row stands after it
    chosen = choose(at)  # [B]
    for _ in range(table.depth):
        wanted = at * KEY_STRIDE + chosen  # [B] the key of the child each row would descend to
        child = ((keys == wanted[:, None]) * slots).sum(dim=1)  # [B] its slot, 0: none
        at = torch.maximum(at, child)  # a child's slot is past its parent's
        stood.append(at)
        chosen = choose(at)
    walked = torch.stack([*stood, chosen], dim=1).tolist()  # one read back: [B, levels + 1]
    verdicts = []
    for d, row in zip(drafts, walked, strict=True):
        accepted = sorted(set(row[:-1]) - {0})  # the slots stood on, each once, in path order
        verdicts.append(Verdict(accepted_slots=accepted, tokens=[d.tokens[s - 1] for s in accepted] + [row[-1]]))
    return verdicts


def relaxed_walk(draft: Draft, logits: torch.Tensor, top_beta: int, tolerance: float) -> Verdict:
    """`logits` [N + 1, V]. Among acceptable children the one the target ranks highest is taken."""
    top_values, top_ids = logits.float().topk(min(top_beta, logits.shape[-1]), dim=-1)  # [N+1, β]
    values, ids = top_values.tolist(), top_ids.tolist()
    children = children_by_slot(draft)
    slot, path = 0, []
    while True:
        best = values[slot][0]
        child = next(
            (
                children[slot][t]
                for t, v in zip(ids[slot], values[slot], strict=True)
                if v >= best - tolerance and t in children[slot]
            ),
            None,
        )
        if child is None:
            break
        path.append(child)
        slot = child
    return Verdict(accepted_slots=path, tokens=[draft.tokens[s - 1] for s in path] + [ids[slot][0]])


def typical_walk(draft: Draft, probs: torch.Tensor, chosen: list[int], epsilon: float, delta: float) -> Verdict:
    """`probs` [N + 1, V] the target's distribution at each slot; `chosen[slot]` its token there.

    A node passes when its parent passes (or is the pending token) and its token's probability at
    the parent's slot exceeds min(ε, δ·exp(−H)). The deepest passing node ends the path (ties: the
    higher Σ log p), then the target's own token at that node's slot.
    """
    probs = probs.double()
    entropy = -(probs * (probs + 1e-5).log()).sum(dim=-1)  # [N + 1]; the reference's guard against log 0
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy)).tolist()
    parent_slots = torch.tensor(draft.parents, dtype=torch.long) + 1  # [N]
    token_p = probs[parent_slots, torch.tensor(draft.tokens, dtype=torch.long)].tolist()  # [N]
    depth, score = [0], [0.0]  # per slot: path length and Σ log p through it; -1 depth: fails
    best = 0
    for i, (p, parent) in enumerate(zip(token_p, draft.parents, strict=True)):
        passes = depth[parent + 1] >= 0 and p > threshold[parent + 1]
        depth.append(depth[parent + 1] + 1 if passes else -1)
        score.append(score[parent + 1] + math.log(p) if passes else -math.inf)
        if passes and (depth[i + 1], score[i + 1]) > (depth[best], score[best]):
            best = i + 1
    path = []
    while best:
        path.append(best)
        best = draft.parents[best - 1] + 1
    path.reverse()
    return Verdict(accepted_slots=path, tokens=[draft.tokens[s - 1] for s in path] + [chosen[path[-1] if path else 0]])

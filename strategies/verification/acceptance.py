"""Acceptance rules: which draft tokens a target forward keeps, and the one target token that follows.

Output of a step = accepted draft tokens + one target token (the correction at the first rejection,
or the bonus token when the whole path is accepted). The core is pure functions of one row's draft
and the target's choices or probabilities at every slot (slot 0: the pending token; slot i+1: node i):

- `walk`: the target's own choice at each slot (its argmax, or its keyed sample); descend while a
  child carries that token. Greedy: exactly greedy decoding. Sampling: each emitted token is the
  target's sample at its position, whatever drafted the tree — lossless. `walk` is the
  specification; the verifier runs `walk_rows`, the same walk over every row at once, one level of
  the trees per pass, which asks for the target's choice only at the slots the walk reaches (on a
  CPU an argmax over the vocabulary at every slot of a wide batch's trees costs more than the rest
  of the step's host work together when the walk stops early). On a CPU each level's choices are
  read back and the rows descend in Python: a few dictionary lookups per row cost less than matching
  keys in tensor operations; on an accelerator the levels stay on the device, one read back per
  step. On a CPU with few slots (`HOST_SLOTS_REDUCED_AT_ONCE`), and whenever the choices are keyed
  samples drawn at every slot anyway, every slot's choice is read back at once and `walk` itself
  runs per row: a level's indexing and read back cost more than the slots it spares.
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
- `rejection_chains` (speculative sampling, Leviathan et al. / Chen et al.): accept draft token x with
  probability min(1, p(x)/q(x)); at the first rejection draw from norm(max(0, p − q)); after a fully
  accepted chain draw the bonus from p. The emitted tokens follow the target's distribution exactly.
  It runs on every row at once on the target's device (the drafts' probabilities and the keyed
  uniforms are moved there), so a GPU step reads back two integers per row.

The rule a strategy hands the verifier (`strategies.verification.verify`) is one of the classes of
`strategies.verification.rules`, which declare whether they are lossless and refuse the combinations
their math does not cover; `accept` applies its function here (`ACCEPTORS`) to every row of a verify
forward.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from strategies.runtime.sampling import (
    STREAM_ACCEPT,
    STREAM_RESIDUAL,
    STREAM_TARGET,
    SamplingParams,
    filtered_probs,
    greedy_tokens,
    keyed_uniform,
    sample_from,
)
from strategies.verification.drafts import Draft, children_by_slot, is_chain, tree_depths
from strategies.verification.rules import AcceptanceRule, ExactMatch, RejectionSampling, Relaxed, Typical


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


# Greedy on a CPU, up to this many verify slots (batch × width) one reduction over the vocabulary at
# every slot costs less than `walk_rows`' reduction, indexing and read back per level: an 8,192-token
# vocabulary, 2 threads, three accepted levels, 19-30 µs against 103-105 at batch 1 (5 and 9 wide),
# 86 against 151 at 4 × 9, 180 against 231 at 8 × 9, and 348 against 258 at 8 × 17.
HOST_SLOTS_REDUCED_AT_ONCE = 64

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


def rejection_chains(
    p: torch.Tensor,  # [B, N + 1, V] target probabilities (after temperature / top-k / top-p)
    q: torch.Tensor,  # [B, N, V] draft probabilities, rows past a chain's length unused
    tokens: torch.Tensor,  # [B, N] draft tokens, rows past a chain's length unused
    lengths: torch.Tensor,  # [B] each row's chain length
    accept_u: torch.Tensor,  # [B, N + 1] uniforms for the acceptance test of the token drawn at each slot
    residual_u: torch.Tensor,  # [B, N + 1] uniforms for a draw from the residual at a rejection there
    target_u: torch.Tensor,  # [B, N + 1] uniforms for a draw from p there (the bonus after a whole chain)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling over every row's chain at once: ([B] accepted draft tokens, [B] the token after).

    Every tensor must be on one device (the target's: `RejectionSampling` moves the rest there), and the
    arithmetic stays there, so a step reads back two integers per row. q is compared in p's dtype.
    """
    b, width, _ = p.shape
    rows, slots = torch.arange(b, device=p.device), torch.arange(width, device=p.device)
    q = q.to(p.dtype)
    p_drafted = p[:, :-1].gather(-1, tokens[..., None])[..., 0]  # [B, N]
    q_drafted = q.gather(-1, tokens[..., None])[..., 0].clamp(min=torch.finfo(q.dtype).tiny)  # [B, N]
    ratio = torch.cat([p_drafted / q_drafted, p.new_ones(b, 1)], dim=-1)  # [B, N + 1]; no draft: N = 0
    # A chain stops at its first rejected token, else at its end; argmax takes the first stop.
    rejected = (slots[None] < lengths[:, None]) & (accept_u.to(ratio.dtype) >= ratio.clamp(max=1.0))  # [B, N + 1]
    accepted = (rejected | (slots[None] >= lengths[:, None])).int().argmax(dim=-1)  # [B]
    was_rejected = (accepted < lengths)[:, None]  # [B, 1]
    p_there = p[rows, accepted]  # [B, V]
    q_there = torch.cat([q, q.new_zeros(b, 1, q.shape[-1])], dim=1)[rows, accepted]  # [B, V]; zeros past the chain
    residual = (p_there - q_there).clamp(min=0)
    # p == q leaves no residual: any draw from p is exact.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_there)
    dist = torch.where(was_rejected, residual / residual.sum(dim=-1, keepdim=True), p_there)
    u = torch.where(was_rejected[:, 0], residual_u[rows, accepted], target_u[rows, accepted])
    return accepted, sample_from(dist, u)


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


@dataclass(frozen=True)
class Slots:
    """Where each verify slot's token would be drawn: the keys of its sampled draws."""

    seed: int
    keys: torch.Tensor  # [B] the rows' sampling keys
    positions: torch.Tensor  # [B, W] generation index of the token chosen at each slot (generated + depth)

    def uniforms(self, stream: int) -> torch.Tensor:
        """[B, W] keyed uniforms of `stream` at every slot."""
        b, w = self.positions.shape
        keys = self.keys[:, None].expand(b, w).reshape(-1)
        return keyed_uniform(self.seed, keys, self.positions.reshape(-1), stream).view(b, w)


def target_choices(logits: torch.Tensor, slots: Slots, sampling: SamplingParams) -> list[list[int]]:
    """[B][W] the target's own token at every slot: its argmax, or its keyed sample (stream 0)."""
    if sampling.greedy:
        return greedy_tokens(logits).tolist()
    return sampled_choices(logits, slots, sampling).tolist()


def sampled_choices(logits: torch.Tensor, slots: Slots, sampling: SamplingParams) -> torch.Tensor:
    """[B, W] the target's keyed sample (stream 0) at every slot, on the logits' device."""
    b, w, v = logits.shape
    probs = filtered_probs(logits, sampling).reshape(b * w, v)
    return sample_from(probs, slots.uniforms(STREAM_TARGET).reshape(-1).to(probs.device)).view(b, w)


Acceptor = Callable[[AcceptanceRule, torch.Tensor, list[Draft], Slots, SamplingParams], list[Verdict]]


def accept(
    rule: AcceptanceRule, logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> list[Verdict]:
    """Each row's verdict under `rule` from the verify forward's `logits` [B, W, V] (slot s of row b:
    logits[b, s])."""
    acceptor = ACCEPTORS.get(type(rule))
    if acceptor is None:
        raise TypeError(f"acceptance rule {type(rule).__name__} has no entry in ACCEPTORS: add its function there")
    return acceptor(rule, logits, drafts, slots, sampling)


def accept_exact(
    rule: ExactMatch, logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> list[Verdict]:
    on_host = logits.device.type == "cpu"
    if on_host and (not sampling.greedy or logits.shape[0] * logits.shape[1] <= HOST_SLOTS_REDUCED_AT_ONCE):
        # Every slot's choice read back at once and each row walked in Python (`walk` itself).
        return [walk(d, chosen) for d, chosen in zip(drafts, target_choices(logits, slots, sampling), strict=True)]
    rows = torch.arange(len(drafts), device=logits.device)
    if sampling.greedy:

        def choose(at: torch.Tensor) -> torch.Tensor:
            return greedy_tokens(logits[rows, at])  # [B]: the argmax at the slots reached, no others
    else:
        drawn = sampled_choices(logits, slots, sampling)  # [B, W]: every slot's keyed draw

        def choose(at: torch.Tensor) -> torch.Tensor:
            return drawn[rows, at]

    table = DraftTable.of(drafts, logits.device)
    return walk_rows(drafts, table, choose, stop_early=on_host)


def accept_rejection_sampling(
    rule: RejectionSampling, logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> list[Verdict]:
    if sampling.greedy:
        return accept_exact(ExactMatch(), logits, drafts, slots, sampling)
    if any(not is_chain(d) for d in drafts if len(d)):
        raise ValueError(rule.refusal(greedy=False, trees=True))
    accepted, tokens = decide_rejection_sampling(logits, drafts, slots, sampling).tolist()
    return [
        Verdict(accepted_slots=list(range(1, a + 1)), tokens=[*d.tokens[:a], t])
        for d, a, t in zip(drafts, accepted, tokens, strict=True)
    ]


def decide_rejection_sampling(
    logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> torch.Tensor:
    """[2, B] on the logits' device: each row's accepted draft tokens, and the token after them.

    The target's probabilities stay where the verify forward left them; the drafts' probabilities
    (a draft model may run on another device) and the keyed uniforms (made on the CPU, the same
    on every device) go there.
    """
    probs = filtered_probs(logits, sampling)  # [B, W, V]
    b, width, vocab = probs.shape
    device = probs.device
    q = torch.zeros(b, width - 1, vocab, dtype=probs.dtype, device=device)  # [B, N, V]
    tokens = torch.zeros(b, width - 1, dtype=torch.long)  # [B, N]
    for row, d in enumerate(drafts):
        n = len(d)
        tokens[row, :n] = torch.tensor(d.tokens, dtype=torch.long)
        if d.probs is None:  # a deterministic draft: q is one-hot
            q[row, torch.arange(n, device=device), tokens[row, :n].to(device)] = 1.0
        elif n:
            q[row, :n] = d.probs.to(device, probs.dtype)
    lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long, device=device)
    # Draft token i is a candidate for the token drawn at slot i (generation index generated + i).
    accepted, token = rejection_chains(
        probs,
        q,
        tokens.to(device),
        lengths,
        slots.uniforms(STREAM_ACCEPT).to(device),
        slots.uniforms(STREAM_RESIDUAL).to(device),
        slots.uniforms(STREAM_TARGET).to(device),
    )
    return torch.stack([accepted, token])


def accept_relaxed(
    rule: Relaxed, logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> list[Verdict]:
    return [relaxed_walk(d, logits[row, : len(d) + 1], rule.top_beta, rule.tolerance) for row, d in enumerate(drafts)]


def accept_typical(
    rule: Typical, logits: torch.Tensor, drafts: list[Draft], slots: Slots, sampling: SamplingParams
) -> list[Verdict]:
    if sampling.greedy:
        return accept_exact(ExactMatch(), logits, drafts, slots, sampling)
    chosen = target_choices(logits, slots, sampling)
    probs = filtered_probs(logits, sampling)
    return [
        typical_walk(d, probs[row, : len(d) + 1], chosen[row], rule.epsilon, rule.delta) for row, d in enumerate(drafts)
    ]


# Each rule's function, by the rule's class (`strategies.verification.rules`).
ACCEPTORS: dict[type[AcceptanceRule], Acceptor] = {
    ExactMatch: accept_exact,
    RejectionSampling: accept_rejection_sampling,
    Relaxed: accept_relaxed,
    Typical: accept_typical,
}

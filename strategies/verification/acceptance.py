"""Acceptance rules: which draft tokens a target forward keeps, and the one target token that follows.

Output of a step = accepted draft tokens + one target token (the correction at the first rejection,
or the bonus token when the whole path is accepted). The rules' cores are pure functions of one row's
draft and the target's choices or probabilities at every slot (slot 0: the pending token; slot i+1:
node i): the tree walks of exact matching (`walk`, run over every row as `walk_rows`), relaxed and
typical acceptance are in `strategies.verification.tree_walks`; here:

- exact matching on a CPU with few slots (`HOST_SLOTS_REDUCED_AT_ONCE`), and whenever the choices are
  keyed samples drawn at every slot anyway: every slot's choice is read back at once and `walk`
  itself runs per row, since a level's indexing and read back cost more than the slots it spares.
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
from strategies.verification.drafts import Draft, is_chain
from strategies.verification.rules import AcceptanceRule, ExactMatch, RejectionSampling, Relaxed, Typical
from strategies.verification.tree_walks import DraftTable, Verdict, relaxed_walk, typical_walk, walk, walk_rows

# Greedy on a CPU, up to this many verify slots (batch × width) one reduction over the vocabulary at
# every slot costs less than `walk_rows`' reduction, indexing and read back per level; beyond it the
# levels the walk does not reach spare more than each level's overhead costs.
HOST_SLOTS_REDUCED_AT_ONCE = 64


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

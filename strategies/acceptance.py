"""Acceptance rules: which draft tokens a target forward keeps, and the one target token that follows.

Output of a step = accepted draft tokens + one target token (the correction at the first rejection,
or the bonus token when the whole path is accepted). All rules are pure functions of one row's draft
and the target's choices or probabilities at every slot (slot 0: the pending token; slot i+1: node i).

- `walk`: the target's own choice at each slot (its argmax, or its keyed sample); descend while a
  child carries that token. Greedy: exactly greedy decoding. Sampling with a deterministic draft
  (lookup, trees): each emitted token is the target's sample at its position — lossless.
- `relaxed_walk` (SpecDec): a child is accepted when it is among the target's top-β and its logit is
  within `tolerance` of the top-1 (β=1, tolerance 0: exactly greedy). Lossy by design.
- `rejection_chain` (speculative sampling, Leviathan et al. / Chen et al.): accept draft token x with
  probability min(1, p(x)/q(x)); at the first rejection draw from norm(max(0, p − q)); after a fully
  accepted chain draw the bonus from p. The emitted tokens follow the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.drafts import Draft, children_by_slot
from strategies.sampling import sample_from


@dataclass
class Verdict:
    path: list[int]  # accepted node slots (1-based slots of the verify forward), root to leaf
    tokens: list[int]  # accepted draft tokens, then the target's token


def walk(draft: Draft, chosen: list[int]) -> Verdict:
    """`chosen[slot]`: the target's token at each slot (length N + 1)."""
    children = children_by_slot(draft)
    slot, path = 0, []
    while (child := children[slot].get(chosen[slot])) is not None:
        path.append(child)
        slot = child
    return Verdict(path=path, tokens=[draft.tokens[s - 1] for s in path] + [chosen[slot]])


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
    return Verdict(path=path, tokens=[draft.tokens[s - 1] for s in path] + [ids[slot][0]])


def rejection_chain(
    draft: Draft,
    p: torch.Tensor,  # [N + 1, V] target probabilities (after temperature / top-k / top-p)
    accept_u: torch.Tensor,  # [N] uniforms for the acceptance tests
    residual_u: torch.Tensor,  # [N] uniforms for a draw from the residual at a rejection
    bonus_u: float,  # uniform for the draw from p after a fully accepted chain
) -> Verdict:
    """Speculative sampling over a chain with draft probabilities `draft.probs` [N, V]."""
    q = draft.probs
    n = len(draft)
    if n:
        idx = torch.arange(n)
        tokens = torch.tensor(draft.tokens)
        ratio = p[idx, tokens] / q[idx, tokens].clamp(min=torch.finfo(q.dtype).tiny)  # [N]
        rejected = (accept_u.to(ratio.dtype) >= ratio.clamp(max=1.0)).tolist()
    else:
        rejected = []
    for i in range(n):
        if rejected[i]:
            residual = (p[i] - q[i].to(p.dtype)).clamp(min=0)
            if float(residual.sum()) <= 0:  # p == q: any draw from p is exact
                residual = p[i]
            token = int(sample_from((residual / residual.sum())[None], residual_u[i : i + 1])[0])
            return Verdict(path=list(range(1, i + 1)), tokens=[*draft.tokens[:i], token])
    token = int(sample_from(p[n : n + 1], torch.tensor([bonus_u]))[0])
    return Verdict(path=list(range(1, n + 1)), tokens=[*draft.tokens, token])

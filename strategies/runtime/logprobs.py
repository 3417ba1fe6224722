"""Log-probabilities of emitted tokens under the target: what offline evaluation scores with.

They are raw: the log-softmax of the target's logits at the position that chose the token, before
temperature, top-k or top-p (what vLLM reports by default, its `raw_logprobs`). So a score does not
depend on the sampling settings, exists at temperature 0, and is the model's own likelihood of the
text. Every strategy takes them from the target forward that decided the token (the prefill, a
plain step, or the verify forward at the slot that chose it), never from a drafter: a lossless
strategy's scores are plain decoding's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the target's `k` most likely tokens at its position."""

    logprob: float
    top_ids: tuple[int, ...]  # best first
    top_logprobs: tuple[float, ...]


def score_tokens(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> list[TokenLogprob]:
    """`logits` [N, V] at the positions that chose `tokens` [N] -> one `TokenLogprob` per token,
    computed in float64 for a float64 model and in float32 otherwise."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logp = logits.to(dtype).log_softmax(dim=-1)  # [N, V]
    chosen = logp.gather(-1, tokens.to(logp.device)[:, None]).squeeze(-1).tolist()  # [N]
    if top > 0:
        values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)  # [N, k]
        top_values, top_ids = values.tolist(), ids.tolist()
    else:
        top_values = top_ids = [[] for _ in chosen]
    return [TokenLogprob(c, tuple(i), tuple(v)) for c, i, v in zip(chosen, top_ids, top_values, strict=True)]

"""How close a lossy strategy's output stays to the target's greedy output of the same prompts.

Three views, from strict to lenient: exact match (the whole row equal), token accuracy (the share of
positions holding the same token, over the reference's length), and chrF (Popović 2015: the F-score
with β = 2 of character n-grams, n = 1…6, whitespace removed, averaged over rows, 0–100), which
credits output that is right in substance but shifted by a token.
"""

from __future__ import annotations

from collections import Counter

CHRF_ORDER = 6
CHRF_BETA = 2.0


def token_accuracy(output: list[int], reference: list[int]) -> float:
    """Share of the reference's positions where the output holds the same token (missing ones are wrong)."""
    if not reference:
        return 1.0 if not output else 0.0
    return sum(a == b for a, b in zip(output, reference, strict=False)) / len(reference)


def chrf(output: str, reference: str) -> float:
    """Sentence chrF (0–100) of `output` against `reference`."""
    hyp, ref = "".join(output.split()), "".join(reference.split())
    precisions, recalls = [], []
    for n in range(1, CHRF_ORDER + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        if not h and not r:
            continue
        common = sum((h & r).values())
        precisions.append(common / sum(h.values()) if h else 0.0)
        recalls.append(common / sum(r.values()) if r else 0.0)
    if not precisions:
        return 100.0
    p, r = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if p + r == 0:
        return 0.0
    b2 = CHRF_BETA**2
    return 100.0 * (1 + b2) * p * r / (b2 * p + r)


def _ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def agreement(
    outputs: list[list[int]], references: list[list[int]], texts: list[str], reference_texts: list[str]
) -> dict[str, float]:
    """Mean exact match, token accuracy and chrF of rows against their references."""
    n = len(references)
    return {
        "exact_match": round(sum(o == r for o, r in zip(outputs, references, strict=True)) / n, 4),
        "token_accuracy": round(sum(token_accuracy(o, r) for o, r in zip(outputs, references, strict=True)) / n, 4),
        "chrf": round(sum(chrf(o, r) for o, r in zip(texts, reference_texts, strict=True)) / n, 2),
    }

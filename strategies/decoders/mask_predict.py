"""Mask-Predict (Ghazvininejad et al. 2019): a block of N tokens filled in parallel, then refined.

The CMLM (`strategies.artifacts.cmlm`) first predicts the block's length from the context; the l most likely
lengths are each decoded (the length beam). Pass 0 predicts every position of the all-masked block;
pass t = 1 … T−1 re-masks the n = ⌊N·(T−t)/T⌋ positions of lowest probability and predicts only
those again (a position keeps the probability it had when last predicted). Of a row's l candidates,
the one of highest mean log-probability wins. Outputs longer than the CMLM's longest block L are
decoded block after block, each block's tokens joining the context of the next.

Lossy: nothing checks the tokens against the target, which is never run. The job records it
(the manifest's `lossy`), `auto` never picks it, and it decodes greedily only. Each row records
the passes it took and the lengths chosen (the `iterations` and `block_lengths` columns it declares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from strategies.artifacts.cmlm import CMLM
from strategies.base import (
    BatchOutput,
    GenerationParams,
    RowOutput,
    RowRequest,
    Segment,
    decode_to_end,
    finish_reason,
)
from strategies.runtime.batch import Row

NAME = "mask_predict"

# (per lane, its block's tokens with the mask id where masked; which positions need a prediction [lanes, W])
# -> the most likely token's log-probability and the token at each needed position ([lanes, W] each).
ReadBlock = Callable[[list[list[int]], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def remask_counts(sizes: torch.Tensor, t: int, iterations: int) -> torch.Tensor:
    """n = ⌊N·(T−t)/T⌋ per lane (`sizes` [lanes] int64): how many tokens pass t re-masks."""
    return sizes * (iterations - t) // iterations


def lowest(scores: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[lanes, W] bool: per lane, its `counts` valid positions of lowest `scores` (ties: the earlier position)."""
    ranked = scores.masked_fill(~valid, float("inf"))
    order = torch.sort(ranked, dim=1, stable=True).indices  # [lanes, W] ascending
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1]).expand_as(order).contiguous())
    return (rank < counts[:, None]) & valid


def length_candidates(length_logprobs: torch.Tensor, caps: list[int], beam: int) -> list[list[int]]:
    """Per row, its `beam` most likely lengths in 1 … cap (most likely first; `length_logprobs` [B, L]
    holds log p(length = n) at column n − 1)."""
    out = []
    for row, cap in enumerate(caps):
        scores = length_logprobs[row, :cap]
        k = min(beam, cap)
        out.append([int(i) + 1 for i in torch.topk(scores, k, sorted=True).indices.tolist()])
    return out


@dataclass
class Refined:
    tokens: list[list[int]]  # per lane: its N tokens
    scores: torch.Tensor  # [lanes] mean log-probability of the lane's tokens
    passes: list[int]  # per lane: passes that predicted at least one of its tokens


def refine(read_block: ReadBlock, sizes: list[int], iterations: int, mask_id: int) -> Refined:
    """Mask-Predict's T passes over lanes of `sizes` tokens (each a row and one length candidate)."""
    lanes, width = len(sizes), max(sizes)
    n = torch.tensor(sizes, dtype=torch.long)
    valid = torch.arange(width)[None, :] < n[:, None]  # [lanes, W]
    tokens = torch.full((lanes, width), mask_id, dtype=torch.long)
    logp = torch.zeros(lanes, width)  # each token's log-probability when it was last predicted
    masked = valid.clone()
    passes = torch.zeros(lanes, dtype=torch.long)
    for t in range(iterations):
        if t > 0:
            counts = remask_counts(n, t, iterations)
            if int(counts.max()) == 0:
                break
            masked = lowest(logp, valid, counts)
            tokens = tokens.masked_fill(masked, mask_id)
        blocks = [tokens[lane, : sizes[lane]].tolist() for lane in range(lanes)]
        best, choice = read_block(blocks, masked)  # [lanes, W] each
        tokens = torch.where(masked, choice, tokens)
        logp = torch.where(masked, best, logp)
        passes += masked.any(dim=1).long()
    scores = (logp * valid).sum(dim=1) / n
    return Refined([tokens[lane, : sizes[lane]].tolist() for lane in range(lanes)], scores, passes.tolist())


def best_lanes(scores: torch.Tensor, owners: list[int], rows: int) -> list[int]:
    """Per row, the index of its lane (`owners[lane]` = the lane's row) of highest score (first on ties)."""
    best: list[int] = [-1] * rows
    for lane, row in enumerate(owners):
        if best[row] < 0 or float(scores[lane]) > float(scores[best[row]]):
            best[row] = lane
    return best


class MaskPredictSettings(Protocol):
    """What it reads of `strategy.mask_predict` (`strategies.methods.mask_predict.MaskPredictOptions`,
    which checks them)."""

    iterations: int
    length_beam: int
    max_length: int


class MaskPredictStrategy:
    """Rows of one batch decoded block by block with the CMLM; the target is not run."""

    name = NAME

    def __init__(self, cmlm: CMLM, options: MaskPredictSettings) -> None:
        if options.max_length > cmlm.max_length:
            raise ValueError(
                f"strategy.mask_predict.max_length={options.max_length} exceeds the CMLM's longest block "
                f"({cmlm.max_length}, cmlm.json max_length): use at most that, or 0"
            )
        self.cmlm = cmlm
        self.options = options
        self.block = options.max_length or cmlm.max_length

    def open(self, requests: list[RowRequest], params: GenerationParams) -> MaskPredictDecoding:
        if not params.sampling.greedy:
            raise ValueError("strategy.name=mask_predict decodes greedily only: set generation.temperature=0")
        if params.logprobs is not None:
            raise ValueError("strategy mask_predict never runs the target, so it has no target log-probabilities")
        decoding = MaskPredictDecoding(self, params)
        decoding.admit(requests)
        return decoding

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        return decode_to_end(NAME, self.open(requests, params), len(requests))


@dataclass(eq=False)
class _MaskPredictRow(Row):
    """A row in Mask-Predict decoding: its output, the passes it took and the length of each block, and
    the context tokens not yet in the CMLM's cache (its prompt until its first block, then the block)."""

    passes: int = 0
    lengths: list[int] = field(default_factory=list)
    feed: list[int] = field(default_factory=list)


class MaskPredictDecoding:
    """Rows in Mask-Predict decoding (`base.Decoding`): a step is one block for every active row."""

    def __init__(self, strategy: MaskPredictStrategy, params: GenerationParams) -> None:
        self.strategy, self.params = strategy, params
        self.kv = strategy.cmlm.new_kv(0)  # one row per active row
        self.rows: list[_MaskPredictRow] = []  # the active rows, in the cache's order
        self.unreported: list[_MaskPredictRow] = []  # rows whose end `finished` has not told
        self.count = 0  # requests so far: the next is numbered `count`
        self.since = {"mask_predict_blocks": 0, "mask_predict_passes": 0, "mask_predict_tokens": 0}

    def active(self) -> int:
        return len(self.rows)

    def admit(self, requests: list[RowRequest]) -> None:
        self.kv.extend(self.strategy.cmlm.new_kv(len(requests)))  # their prompts are read at the next step
        joining = [_MaskPredictRow(r, self.count + k, feed=list(r.prompt)) for k, r in enumerate(requests)]
        self.count += len(requests)
        self.rows += joining
        self.unreported += joining

    def step(self) -> None:
        """One block for every active row: lengths predicted, blocks refined, tokens emitted through the
        finish checks."""
        strategy, params, kv, active = self.strategy, self.params, self.kv, self.rows
        cmlm, o = strategy.cmlm, strategy.options
        max_context = cmlm.runner.max_context
        length_lp = cmlm.read(kv, [row.feed for row in active]).lengths  # [B, L]
        caps = [
            max(
                1,
                min(
                    strategy.block,
                    params.max_new_tokens - len(row.tokens),
                    max_context - len(row.request.prompt) - len(row.tokens),
                ),
            )
            for row in active
        ]
        # With ignore_eos the output is max_new_tokens long whatever the predicted end.
        fixed = params.ignore_eos
        candidates = [[cap] for cap in caps] if fixed else length_candidates(length_lp, caps, o.length_beam)
        owners = [b for b, c in enumerate(candidates) for _ in c]
        sizes = [n for c in candidates for n in c]
        if len(owners) > len(active):
            kv.select_rows(torch.tensor(owners, dtype=torch.long, device=kv.valid.device))
        refined = refine(
            lambda blocks, masked: cmlm.best_tokens(cmlm.read(kv, [[]] * len(blocks), blocks).states, masked),
            sizes,
            o.iterations,
            cmlm.config.mask_token_id,
        )
        chosen = best_lanes(refined.scores, owners, len(active))
        if len(owners) > len(active):
            kv.select_rows(torch.tensor(chosen, dtype=torch.long, device=kv.valid.device))
        still = []
        for b, (row, lane) in enumerate(zip(active, chosen, strict=True)):
            row.passes += refined.passes[lane]
            row.lengths.append(sizes[lane])
            self.since["mask_predict_blocks"] += 1
            self.since["mask_predict_passes"] += refined.passes[lane]
            emitted = []
            for token in refined.tokens[lane]:
                row.tokens.append(token)
                emitted.append(token)
                row.reason = finish_reason(row.request, row.tokens, params, max_context)
                if row.reason is not None:
                    break
            self.since["mask_predict_tokens"] += len(emitted)
            if row.reason is None:
                still.append(b)
                row.feed = emitted
        if len(still) < len(active) and still:
            kv.select_rows(torch.tensor(still, dtype=torch.long, device=kv.valid.device))
        self.rows = [active[b] for b in still]
        if not still:
            self.kv = cmlm.new_kv(0)

    def finished(self) -> list[tuple[int, RowOutput]]:
        done = [row for row in self.unreported if row.reason is not None]
        self.unreported = [row for row in self.unreported if row.reason is None]
        return [
            (
                row.number,
                RowOutput(row.tokens, row.reason, columns={"iterations": row.passes, "block_lengths": row.lengths}),
            )
            for row in done
        ]

    def segment(self) -> Segment:
        stats = dict(self.since)
        self.since = dict.fromkeys(stats, 0)
        return Segment(0, stats["mask_predict_tokens"], stats)

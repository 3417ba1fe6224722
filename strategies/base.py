"""The contract between the worker and a decoding strategy: rows in, tokens and finish reasons out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from strategies.logprobs import TokenLogprob
from strategies.sampling import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    sampling: SamplingParams
    eos_token_ids: frozenset[int]
    ignore_eos: bool = False
    # None: no scores; k >= 0: each emitted token's log-probability under the target and its k best
    # alternatives (`strategies.logprobs`).
    logprobs: int | None = None


@dataclass
class RowRequest:
    prompt: list[int]
    key: int  # sampling key of the row (`sampling.row_key(row_id)`)
    # Called with the row's generated tokens after each new token; True ends the row (stop string).
    stop: Callable[[list[int]], bool] | None = None


@dataclass
class RowOutput:
    tokens: list[int]
    finish_reason: str  # FINISH_STOP | FINISH_LENGTH
    strategy: str | None = None  # what decoded the row when it differs from the batch's strategy
    mean_exit_layer: float | None = None  # early exit (calm): layers its tokens went through, on average
    iterations: int | None = None  # mask_predict: CMLM passes over the row's blocks, all blocks together
    block_lengths: list[int] | None = None  # mask_predict: the length chosen for each of the row's blocks
    logprobs: list[TokenLogprob] | None = None  # one per token, when `GenerationParams.logprobs` asks


@dataclass
class BatchOutput:
    rows: list[RowOutput]
    strategy: str
    target_forwards: int  # decode forwards of the target model, prefill excluded
    stats: dict[str, float] = field(default_factory=dict)


class Strategy(Protocol):
    name: str

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput: ...


def finish_reason(request: RowRequest, tokens: list[int], params: GenerationParams, max_context: int) -> str | None:
    """Why a row ends after its newest token `tokens[-1]`, or None if it goes on.

    EOS and stop strings end it with `stop`; `max_new_tokens` or a full context with `length`
    (the next token would sit at position `max_context`).
    """
    if not params.ignore_eos and tokens[-1] in params.eos_token_ids:
        return FINISH_STOP
    if request.stop is not None and request.stop(tokens):
        return FINISH_STOP
    if len(tokens) >= params.max_new_tokens or len(request.prompt) + len(tokens) >= max_context:
        return FINISH_LENGTH
    return None

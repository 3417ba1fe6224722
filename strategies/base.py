"""The contract between the worker and a decoding strategy: rows in, tokens and finish reasons out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the registry reads this module in the driver, which imports no torch
    from strategies.constraints.grammars import Grammar
    from strategies.runtime.logprobs import TokenLogprob
    from strategies.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class LogitControls:
    """What a row asks of its logits; the defaults ask for nothing."""

    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # tokens of prompt and output: positive logits divided, negative multiplied
    min_p: float = 0.0  # sampling: drop tokens less likely than min_p times the most likely
    min_tokens: int = 0  # EOS and stop_token_ids are impossible until this many tokens are generated
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the row (finish_reason stop), kept in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the logits

    def asks_nothing(self) -> bool:
        return self == LogitControls()


def logit_controls(settings: object) -> LogitControls | None:
    """The controls a row's settings (`workers.common.row_settings.RowSettings`) ask for; None: none."""
    controls = LogitControls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(LogitControls)})
    return None if controls.asks_nothing() else controls


FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    sampling: SamplingParams
    eos_token_ids: frozenset[int]
    ignore_eos: bool = False
    # None: no scores; k >= 0: each emitted token's log-probability under the target and its k best
    # alternatives (`strategies.runtime.logprobs`).
    logprobs: int | None = None


@dataclass
class RowRequest:
    prompt: list[int]
    key: int  # sampling key of the row (`sampling.row_key(row_id)`)
    # Called with the row's generated tokens after each new token; True ends the row (stop string).
    stop: Callable[[list[int]], bool] | None = None
    # Penalties, min_p, min_tokens, stop token ids, logit bias (`strategies.runtime.logit_controls`); None: none.
    controls: LogitControls | None = None
    # Its response_format compiled (`strategies.constraints`): it emits only what the grammar allows; None: none.
    grammar: Grammar | None = None


# An output column a strategy fills for its rows: its name and the Python type of its values (float,
# int, list[int]). Each method declares its columns (`output_columns` of its spec, `strategies/methods/`);
# the output contract (`workers/common/contract.py`) makes them nullable columns of every part.
OutputColumns = dict[str, object]


@dataclass
class RowOutput:
    tokens: list[int]
    finish_reason: str  # FINISH_STOP | FINISH_LENGTH
    strategy: str | None = None  # what decoded the row when it differs from the batch's strategy
    # Values of the output columns its strategy declares (`OutputColumns`), by column name.
    columns: dict[str, object] = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None  # one per token, when `GenerationParams.logprobs` asks
    # Drafting strategies: tokens each option emitted (a drafter's name, or autoregressive for plain
    # steps and the prefill's token), only options that emitted any.
    tokens_by_option: dict[str, int] | None = None


@dataclass
class BatchOutput:
    rows: list[RowOutput]
    strategy: str
    target_forwards: int  # decode forwards of the target model, prefill excluded
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Segment:
    """What a decoding did since the last `Decoding.segment` call: one throughput record's numbers."""

    target_forwards: int  # decode forwards of the target model, prefill excluded
    generated_tokens: int
    stats: dict[str, float] = field(default_factory=dict)


class Decoding(Protocol):
    """A batch in decoding that rows may join between steps (continuous batching).

    Requests are numbered in the order they came: those `Strategy.open` got, then each `admit`'s.
    A request's output is the same whichever rows share its steps, joined when they did.
    """

    def active(self) -> int:
        """Rows still decoding."""

    def step(self) -> None:
        """Decode: at least one token for every active row, often until some row finishes."""

    def admit(self, requests: list[RowRequest]) -> None:
        """Prefill `requests` (one forward) and decode them with the rows still active from now on."""

    def finished(self) -> list[tuple[int, RowOutput]]:
        """Requests that finished since the last call, with their outputs (each reported once)."""

    def segment(self) -> Segment:
        """Forwards and statistics since the last call (the strategy's part of a throughput record)."""


class Strategy(Protocol):
    name: str

    def open(self, requests: list[RowRequest], params: GenerationParams) -> Decoding:
        """Prefill `requests` and return them in decoding."""

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        """Every request decoded to its end, as one batch (`decode_to_end`)."""


def decode_to_end(name: str, decoding: Decoding, count: int) -> BatchOutput:
    """Step `decoding` of `count` requests until every row has finished: one batch, no row joins."""
    rows: list[RowOutput | None] = [None] * count
    while True:
        for index, row in decoding.finished():
            rows[index] = row
        if not decoding.active():
            break
        decoding.step()
    done = decoding.segment()
    return BatchOutput(rows=rows, strategy=name, target_forwards=done.target_forwards, stats=done.stats)


def finish_reason(request: RowRequest, tokens: list[int], params: GenerationParams, max_context: int) -> str | None:
    """Why a row ends after its newest token `tokens[-1]`, or None if it goes on.

    EOS, the row's stop token ids and stop strings end it with `stop`; `max_new_tokens` or a full context with `length`
    (the next token would sit at position `max_context`).
    """
    if not params.ignore_eos and tokens[-1] in params.eos_token_ids:
        return FINISH_STOP
    if request.controls is not None and tokens[-1] in request.controls.stop_token_ids:
        return FINISH_STOP
    if request.stop is not None and request.stop(tokens):
        return FINISH_STOP
    if len(tokens) >= params.max_new_tokens or len(request.prompt) + len(tokens) >= max_context:
        return FINISH_LENGTH
    return None

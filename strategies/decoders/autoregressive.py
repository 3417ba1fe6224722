"""Plain autoregressive decoding: the baseline every accelerated strategy must equal (greedy) or beat."""

from __future__ import annotations

from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, Segment, decode_to_end
from strategies.runtime.batch import PLAIN_RUN_STEPS, Batch, decode_plainly, start_batch
from strategies.runtime.runner import ModelRunner


class AutoregressiveStrategy:
    """One target forward per token for every unfinished row; finished rows leave the batch."""

    name = "autoregressive"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def open(self, requests: list[RowRequest], params: GenerationParams) -> PlainDecoding:
        return PlainDecoding(self.runner, start_batch(self.runner, requests, params))

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        return decode_to_end(self.name, self.open(requests, params), len(requests))


class PlainDecoding:
    """A batch in plain decoding (`base.Decoding`): a step runs until a row finishes, or
    `PLAIN_RUN_STEPS` steps, so that waiting rows can join a batch with room."""

    def __init__(self, runner: ModelRunner, batch: Batch) -> None:
        self.runner = runner
        self.batch = batch
        self.forwards = 0  # since the last segment

    def active(self) -> int:
        return len(self.batch.active)

    def step(self) -> None:
        run = decode_plainly(self.runner, self.batch, PLAIN_RUN_STEPS)
        self.forwards += run.steps
        self.batch.keep(run.still)

    def admit(self, requests: list[RowRequest]) -> None:
        self.batch.admit(start_batch(self.runner, requests, self.batch.params))

    def finished(self) -> list[tuple[int, RowOutput]]:
        return [
            (row.number, RowOutput(tokens=row.tokens, finish_reason=row.reason, logprobs=row.scores))
            for row in self.batch.finished_rows()
        ]

    def segment(self) -> Segment:
        forwards, self.forwards = self.forwards, 0
        return Segment(forwards, self.batch.take_generated())

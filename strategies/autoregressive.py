"""Plain autoregressive decoding: the baseline every accelerated strategy must equal (greedy) or beat."""

from __future__ import annotations

from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest
from strategies.batch import decode_plainly, start_batch
from strategies.runner import ModelRunner


class AutoregressiveStrategy:
    """One target forward per token for every unfinished row; finished rows leave the batch."""

    name = "autoregressive"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        batch = start_batch(self.runner, requests, params)
        forwards = 0
        while batch.active:
            run = decode_plainly(self.runner, batch)
            forwards += run.steps
            batch.keep(run.still)
        rows = [
            RowOutput(tokens=o, finish_reason=r, logprobs=batch.row_scores(i))
            for i, (o, r) in enumerate(zip(batch.outputs, batch.reasons, strict=True))
        ]
        return BatchOutput(rows=rows, strategy=self.name, target_forwards=forwards)

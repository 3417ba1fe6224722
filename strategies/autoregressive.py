"""Plain autoregressive decoding: the baseline every accelerated strategy must equal (greedy) or beat."""

from __future__ import annotations

import torch

from strategies.base import BatchOutput, GenerationParams, RowOutput, RowRequest, finish_reason
from strategies.runner import ModelRunner
from strategies.sampling import choose_tokens


class AutoregressiveStrategy:
    """One target forward per token for every unfinished row; finished rows leave the batch."""

    name = "autoregressive"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def generate(self, requests: list[RowRequest], params: GenerationParams) -> BatchOutput:
        runner = self.runner
        kv = runner.new_kv(len(requests))
        logits = runner.prefill(kv, [r.prompt for r in requests])  # [B, V]
        outputs: list[list[int]] = [[] for _ in requests]
        reasons: list[str | None] = [None] * len(requests)
        active = list(range(len(requests)))  # batch row -> request index
        keys = torch.tensor([r.key for r in requests], dtype=torch.long)  # [B]
        forwards = 0
        while True:
            # Generation index of each row's next token: keys a sampled draw (greedy needs none).
            positions = None if params.sampling.greedy else torch.tensor([len(outputs[i]) for i in active])  # [B]
            tokens = choose_tokens(logits, params.sampling, keys, positions)  # [B]
            still: list[int] = []
            for row, (i, token) in enumerate(zip(active, tokens.tolist(), strict=True)):
                outputs[i].append(token)
                reasons[i] = finish_reason(requests[i], outputs[i], params, runner.max_context)
                if reasons[i] is None:
                    still.append(row)
            if not still:
                break
            if len(still) < len(active):
                index = torch.tensor(still, dtype=torch.long)
                kv.select_rows(index.to(runner.device))
                tokens, keys = tokens[index.to(tokens.device)], keys[index]
                active = [active[row] for row in still]
            new_tokens = tokens[:, None]  # [B, 1]
            out = runner.forward(kv, new_tokens, kv.next_pos[:, None], torch.ones_like(new_tokens, dtype=torch.bool))
            logits = out.logits[:, -1]
            forwards += 1
        rows = [RowOutput(tokens=o, finish_reason=r) for o, r in zip(outputs, reasons, strict=True)]
        return BatchOutput(rows=rows, strategy=self.name, target_forwards=forwards)

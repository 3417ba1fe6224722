"""`accelgen bench structured=true`: the structured-output aims on the JSON-schema synthesis set
(`jobs.bench.structured_set`, `num_prompts` rows, four schemas), in process, at the first of
`batch_sizes`:

- the share of finished constrained outputs (finish_reason stop) that parse and validate with jsonschema;
- constrained autoregressive decoding's time over unconstrained decoding's of the same rows, each
  unconstrained row stopped after as many tokens as its constrained output has (a stop callback), so
  both decode the same number of tokens in batches that shrink alike;
- `auto`'s speed-up over autoregressive decoding, constrained and unconstrained, and the share of the
  unconstrained speed-up it keeps under constraints;
- the grammar's own cost, apart from what the format does to the text: the unconstrained rows decoded
  again under a format that allows any text (the same tokens, which the report checks), autoregressive
  and `auto`. A schema's JSON is another text than the model's free continuation, and drafters predict
  the two differently; this pair holds the text fixed and leaves only the grammar's work.

Each contender decodes every row `repeats` times, a new strategy each round; within a round the contenders
take turns batch by batch, in alternating order (`rounds.in_turns`), so that a drift of the machine's
speed over a pass weighs on all of them alike. Times are medians over rounds. Grammars are compiled
before timing, as an actor compiles each distinct format once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from jobs.bench.decoding import Bench
from jobs.bench.rounds import in_turns
from jobs.bench.settings import BenchConfig
from jobs.bench.structured_set import SCHEMAS, response_format, synthesis_rows
from strategies import registry
from strategies.base import GenerationParams, RowOutput, RowRequest
from strategies.constraints.formats import canonical
from strategies.constraints.grammars import GrammarCache
from strategies.runtime.sampling import SamplingParams, row_key

CONSTRAINED, UNCONSTRAINED, ANY_TEXT = "constrained", "unconstrained", "any text"
KINDS = (CONSTRAINED, UNCONSTRAINED, ANY_TEXT)
CONTENDERS = [(name, kind) for name in ("autoregressive", registry.AUTO) for kind in KINDS]
EVERY_TEXT = {"type": "regex", "pattern": "(.|\\n)*"}  # a format that refuses no text


def label(name: str, kind: str) -> str:
    return f"{name} {kind}"


def main(config: BenchConfig) -> int:
    bench = Bench(dataclasses.replace(config, strategies=["autoregressive", registry.AUTO]))
    report = measure(bench)
    print(json.dumps(report, indent=1))
    if config.report:
        with open(config.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _decode(bench: Bench, name: str, requests: list[RowRequest], params: GenerationParams) -> list[RowOutput]:
    batch_size = bench.config.batch_sizes[0]
    strategy = bench.fresh(dataclasses.replace(bench.config.strategy, name=name), batch_size)
    rows: list[RowOutput] = []
    for first in range(0, len(requests), batch_size):
        rows.extend(strategy.generate(requests[first : first + batch_size], params).rows)
    return rows


def _requests(prompts: list[list[int]], grammars: list, lengths: list[int] | None = None) -> list[RowRequest]:
    """The rows as requests, each with its grammar, or ended after `lengths[i]` tokens."""
    return [
        RowRequest(p, row_key(str(i)), None if lengths is None else _stop_after(lengths[i]), grammar=g)
        for i, (p, g) in enumerate(zip(prompts, grammars, strict=True))
    ]


def _stop_after(count: int) -> Callable[[list[int]], bool]:
    return lambda tokens: len(tokens) >= count


def measure(bench: Bench) -> dict[str, Any]:
    config, tokenizer = bench.config, bench.tokenizer
    rows = synthesis_rows(config.num_prompts)
    prompts = [ids[-config.max_prompt_tokens :] for ids in tokenizer([p for p, _ in rows])["input_ids"]]
    ends = frozenset({tokenizer.eos_token_id})
    grammars = GrammarCache(tokenizer, bench.models.target.vocab_size, ends)
    compiled = [grammars.get(canonical(response_format(name))) for _, name in rows]
    anything = grammars.get(canonical(EVERY_TEXT))
    params = GenerationParams(config.max_new_tokens, SamplingParams(), ends)

    lengths = [len(r.tokens) for r in _decode(bench, "autoregressive", _requests(prompts, compiled), params)]

    def requests(kind: str) -> list[RowRequest]:
        if kind == CONSTRAINED:
            return _requests(prompts, compiled)
        return _requests(prompts, [anything if kind == ANY_TEXT else None] * len(prompts), lengths)

    bench.models.target.warm_up(config.batch_sizes[0])
    for name, kind in CONTENDERS:  # warm-up: first calls allocate and pick kernels
        _decode(bench, name, requests(kind)[: config.batch_sizes[0]], params)
    batch_size = config.batch_sizes[0]

    def start(contender: tuple[str, str]) -> Callable[[int], tuple[float, list[RowOutput]]]:
        # A new strategy per contender each round, as `_decode` makes one per pass, and a controller per
        # contender (one would otherwise rank and size drafters for one text on what it saw of another).
        strategy = bench.fresh(dataclasses.replace(config.strategy, name=contender[0]), batch_size, owner=contender[1])
        pending = requests(contender[1])

        def batch(i: int) -> tuple[float, list[RowOutput]]:
            began = time.perf_counter()
            decoded = strategy.generate(pending[i * batch_size : (i + 1) * batch_size], params).rows
            return time.perf_counter() - began, decoded

        return batch

    count = math.ceil(len(prompts) / batch_size)
    turns = in_turns({c: functools.partial(start, c) for c in CONTENDERS}, count, config.repeats)
    seconds = {label(*c): [sum(s for s, _ in parts) for parts in rounds] for c, rounds in turns.items()}
    outputs = {label(*c): [row for _, rows in rounds[-1] for row in rows] for c, rounds in turns.items()}
    report = _report(tokenizer, rows, {k: statistics.median(v) for k, v in seconds.items()}, outputs)
    return {**report, "seconds_by_round": seconds}  # the spread behind each median


def _valid(tokenizer: Any, row: RowOutput, schema: dict[str, Any]) -> bool:
    import jsonschema  # a test and bench dependency (the dev extra), not the runtime's

    try:
        jsonschema.validate(json.loads(tokenizer.decode(row.tokens, skip_special_tokens=True)), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _report(
    tokenizer: Any, rows: list[tuple[str, str]], seconds: dict[str, float], outputs: dict[str, list[RowOutput]]
) -> dict[str, Any]:
    ar_c, ar_u, ar_a = (label("autoregressive", kind) for kind in KINDS)
    auto_c, auto_u, auto_a = (label(registry.AUTO, kind) for kind in KINDS)
    finished = [(row, name) for row, (_, name) in zip(outputs[ar_c], rows, strict=True) if row.finish_reason == "stop"]
    valid = sum(_valid(tokenizer, row, SCHEMAS[name]) for row, name in finished)
    tokens = {k: sum(len(r.tokens) for r in v) for k, v in outputs.items()}
    speedup_c, speedup_u = seconds[ar_c] / seconds[auto_c], seconds[ar_u] / seconds[auto_u]
    speedup_a = seconds[ar_a] / seconds[auto_a]
    tokens_of = {k: [r.tokens for r in v] for k, v in outputs.items()}
    return {
        "rows": len(rows),
        "finished": len(finished),
        "valid_share_of_finished": valid / len(finished) if finished else None,
        "seconds": seconds,
        "tokens": tokens,
        "constrained_cost": seconds[ar_c] / seconds[ar_u],
        "auto_speedup_constrained": speedup_c,
        "auto_speedup_unconstrained": speedup_u,
        "auto_speedup_kept": speedup_c / speedup_u,
        "auto_tokens_equal_autoregressive": tokens_of[auto_c] == tokens_of[ar_c],
        "grammar_cost_same_tokens": seconds[ar_a] / seconds[ar_u],
        "auto_speedup_kept_same_tokens": speedup_a / speedup_u,
        "any_text_tokens_equal_unconstrained": tokens_of[ar_a] == tokens_of[ar_u] == tokens_of[auto_a],
    }

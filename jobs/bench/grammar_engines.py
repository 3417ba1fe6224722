"""`python -m jobs.bench.grammar_engines [MODEL]`: llguidance and xgrammar on one tokenizer (the shipped
target's by default), measured for what decoding asks of a grammar engine: compiling each schema of
the synthesis set (`jobs.bench.structured_set`), then, walking a valid record of each schema token by
token, the mask of the next token and one advance with its rollback (what a verify forward's draft walk
does per node). The chosen engine and why: docs/benchmarks.md, "Grammar engines".

Decoding imports llguidance alone; xgrammar is imported here only, to measure it, and only where installed.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoTokenizer

from jobs.bench.structured_set import SCHEMAS
from jobs.shipped import SHIPPED_TARGET

RECORDS = {
    "person": {"name": "Ada", "age": 36, "admin": True},
    "product": {"sku": "ABC-1234", "title": "kettle", "tags": ["home", "tea"]},
    "event": {"kind": "retry", "code": 503, "message": "upstream timed out"},
    "point": {"x": -12, "y": 407, "label": None},
}
REPEATS = 5


class Engine:
    """One engine's three operations, on one tokenizer."""

    def __init__(self, name: str, compile_schema: Callable[[dict], Any], matcher: Callable[[Any], Any]) -> None:
        self.name, self.compile_schema, self.matcher = name, compile_schema, matcher


def llguidance_engine(tokenizer: Any, vocab_size: int) -> Engine:
    import llguidance
    import llguidance.hf

    info = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    options = {"whitespace_flexible": False}

    def compile_schema(schema: dict) -> Any:
        return llguidance.LLMatcher(info, llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options))

    bitmask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)

    def ops(compiled: Any) -> tuple:
        m = compiled.deep_copy()
        fill = lambda: m.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)  # noqa: E731
        return m, fill, m.consume_token, m.rollback

    return Engine("llguidance", compile_schema, ops)


def xgrammar_engine(tokenizer: Any, vocab_size: int) -> Engine | None:
    try:
        import xgrammar
    except ImportError:
        return None
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)

    def compile_schema(schema: dict) -> Any:
        compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def ops(compiled: Any) -> tuple:
        m = xgrammar.GrammarMatcher(compiled)
        return m, lambda: m.fill_next_token_bitmask(bitmask, 0), m.accept_token, m.rollback

    return Engine("xgrammar", compile_schema, ops)


def measure(engine: Engine, tokenizer: Any) -> dict[str, float]:
    """Medians: compile ms per schema (first compile of each, a new compiler each time), then per token of
    the records: mask µs, advance + rollback µs."""
    compile_ms, mask_us, step_us = [], [], []
    for name, schema in SCHEMAS.items():
        for _ in range(REPEATS):
            began = time.perf_counter()
            compiled = engine.compile_schema(schema)
            compile_ms.append((time.perf_counter() - began) * 1e3)
        _, fill, advance, rollback = engine.matcher(compiled)
        for token in tokenizer.encode(json.dumps(RECORDS[name], separators=(",", ":")), add_special_tokens=False):
            began = time.perf_counter()
            fill()
            mask_us.append((time.perf_counter() - began) * 1e6)
            began = time.perf_counter()
            advance(token)
            rollback(1)
            step_us.append((time.perf_counter() - began) * 1e6)
            if advance(token) is False:
                raise ValueError(f"{engine.name} refused token {token} of the {name} record: the walk is invalid")
    return {
        "compile_ms": statistics.median(compile_ms),
        "compile_ms_max": max(compile_ms),
        "mask_us": statistics.median(mask_us),
        "advance_rollback_us": statistics.median(step_us),
    }


def main(args: list[str]) -> int:
    model = args[0] if args else str(SHIPPED_TARGET)
    tokenizer = AutoTokenizer.from_pretrained(model)
    vocab_size = len(tokenizer)
    print(f"{'engine':<11} {'compile ms (median / max)':>26} {'mask µs/token':>14} {'advance+rollback µs':>20}")
    for build in (llguidance_engine, xgrammar_engine):
        engine = build(tokenizer, vocab_size)
        if engine is None:
            print(f"{build.__name__.removesuffix('_engine'):<11} not installed")
            continue
        r = measure(engine, tokenizer)
        compiled = f"{r['compile_ms']:.2f} / {r['compile_ms_max']:.2f}"
        print(f"{engine.name:<11} {compiled:>26} {r['mask_us']:>14.1f} {r['advance_rollback_us']:>20.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

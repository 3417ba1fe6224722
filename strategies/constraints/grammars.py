"""Formats compiled to llguidance grammars, once per distinct format per actor, and the matcher that
follows one row's tokens through its grammar.

llguidance was chosen over xgrammar by measurement (`python -m jobs.bench.grammar_engines`,
docs/benchmarks.md): it compiles a schema about ten times faster (each distinct per-row schema is
compiled once per actor, on the decoding thread) and it has no dependencies (xgrammar brings triton
and apache-tvm-ffi). Both roll a matcher back by any number of tokens, which the walk of a verify
forward's draft tree needs; xgrammar's masks are cheaper per token, both small beside a decode step.

JSON is constrained to the spelling Python's `json.dumps` writes by default: `", "` between items, `": "`
after keys and no other whitespace. A model cannot spend its `max_new_tokens` on blank space inside an
object, and it writes what it has read most: on the structured bench's synthesis set the shipped
target's best token was refused at 63% of constrained plain decoding's slots, against 76% under
compact `","` and `":"`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import llguidance
import llguidance.hf
import torch

from strategies.constraints.formats import FormatError

_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 64  # distinct formats an actor keeps compiled


class RowMatcher:
    """Where one row stands in its grammar: it follows the row's emitted tokens (`advance`), and a
    verify forward's draft paths tentatively (`advance`, then `back`)."""

    def __init__(self, matcher: llguidance.LLMatcher, ends: frozenset[int]) -> None:
        self._matcher = matcher
        self.ends = ends  # the model's end tokens: all of them allowed wherever the grammar allows one

    def accepts(self, token: int) -> bool:
        """Whether the grammar allows `token` next."""
        return self._matcher.validate_tokens([token]) == 1

    def advance(self, token: int) -> None:
        self._matcher.consume_token(token)

    def back(self, count: int) -> None:
        """Undo the last `count` tokens advanced through."""
        self._matcher.rollback(count)

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, from where the row stands (JSON's keys and punctuation
        after a value, say): its forced bytes as the tokenizer would write them, then an end token where
        the grammar allows nothing but its end after them (a closed JSON object). Another tokenization
        of the same bytes may be allowed too, and a model with several end tokens chooses among them,
        so they are a draft to verify, not tokens to emit. Drafting the end saves the step that would
        otherwise emit it alone, one of the few steps a short record takes."""
        tokens = self._matcher.compute_ff_tokens()
        if self.ends and self._ends_after(tokens):
            tokens.append(min(self.ends))
        return tokens

    def _ends_after(self, tokens: list[int]) -> bool:
        """Whether the grammar allows only its end after `tokens` (the matcher ends where it began)."""
        consumed = self._matcher.try_consume_tokens(tokens)
        stopped = consumed == len(tokens) and self._matcher.is_stopped() and not self._matcher.is_error()
        self._matcher.rollback(consumed)
        return stopped

    def fill(self, bitmask: torch.Tensor) -> None:
        """Write the tokens allowed next into `bitmask` [words] int32 (bit t of word t // 32: token t)."""
        self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())


class Grammar:
    """A compiled format: each row constrained by it gets its own matcher, a copy of the compiled one."""

    def __init__(self, matcher: llguidance.LLMatcher, ends: frozenset[int]) -> None:
        self._compiled = matcher
        self.ends = ends

    def matcher(self) -> RowMatcher:
        return RowMatcher(self._compiled.deep_copy(), self.ends)


def grammar_text(format_json: str) -> str:
    """The llguidance grammar of a canonical format (`formats.canonical`)."""
    fmt: dict[str, Any] = json.loads(format_json)
    kind = fmt["type"]
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(fmt["json_schema"]["schema"], overrides=_JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(fmt["pattern"])
    if kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in fmt["choices"]))
    return llguidance.LLMatcher.grammar_from_lark(fmt["ebnf"])


class GrammarCache:
    """An actor's compiled formats, by canonical JSON, the least recently used dropped past `size`."""

    def __init__(self, tokenizer: Any, vocab_size: int, ends: Iterable[int], size: int = CACHE_SIZE) -> None:
        self.ends = frozenset(ends)
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(self.ends))
        self._size = size
        self._compiled: OrderedDict[str, Grammar] = OrderedDict()

    def get(self, format_json: str) -> Grammar:
        """The grammar of a canonical format; raises `FormatError` saying why it cannot compile."""
        if format_json in self._compiled:
            self._compiled.move_to_end(format_json)
            return self._compiled[format_json]
        try:
            text = grammar_text(format_json)
        except ValueError as exc:
            raise FormatError(f"it cannot be compiled: {exc}") from None
        matcher = llguidance.LLMatcher(self._tokenizer, text, log_level=0)
        if matcher.is_error():
            raise FormatError(f"it cannot be compiled: {' '.join(matcher.get_error().split())}")
        self._compiled[format_json] = grammar = Grammar(matcher, self.ends)
        if len(self._compiled) > self._size:
            self._compiled.popitem(last=False)
        return grammar

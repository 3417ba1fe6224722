"""Row-level text handling: which prompts can be decoded, stop strings, and the completion text.

A bad row is not a failure of the job: it becomes an output row with `finish_reason=error` and a
message saying what was wrong, so the job goes on and every input row still has its output row.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase


def prompt_problem(prompt: object) -> str | None:
    """Why `prompt` cannot be decoded before tokenizing it, or None."""
    if prompt is None:
        return "prompt is null"
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"prompt is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if not isinstance(prompt, str):
        return f"prompt must be text, got {type(prompt).__name__}"
    if not prompt.strip():
        return "prompt is empty or whitespace only"
    return None


def as_text(prompt: str | bytes) -> str:
    return prompt.decode("utf-8") if isinstance(prompt, bytes) else prompt


def too_long_message(num_tokens: int, max_context: int) -> str:
    return (
        f"prompt has {num_tokens} tokens and the model's context is {max_context}, leaving no room to "
        "generate: shorten the prompt or use a model with a longer context"
    )


class StopStrings:
    """Detects a stop string at the end of a row's generated text, one new token at a time.

    Only the tail of the tokens is decoded: a stop string that completes at the newest token lies
    within the last `len(stop)` characters, and every token decodes to at least one byte; a few
    extra tokens cover multi-byte characters split across tokens.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._decode = tokenizer.decode
        self._tail = max((len(s.encode("utf-8")) for s in self.stops), default=0) + 4

    def for_row(self) -> Callable[[list[int]], bool] | None:
        return self._hit if self.stops else None

    def _hit(self, tokens: list[int]) -> bool:
        text = self._decode(tokens[-self._tail :], skip_special_tokens=True)
        return any(s in text for s in self.stops)


def completion_text(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stops: list[str]) -> str:
    """The generated text, cut before the first stop string (the stop string is not part of it)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return text[: min(cuts)] if cuts else text


def repetition_rate(tokens: list[int]) -> float:
    """Share of a completion's 4-grams that already occurred earlier in it (0: none repeats).

    Retrieval drafting gains from repetition; a weak model that loops inflates those gains, so
    benchmarks and logs report this beside the accepted length.
    """
    n = 4
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0

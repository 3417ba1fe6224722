"""Row-level text handling: which prompts can be decoded, stop strings, and the completion text.

A bad row is not a failure of the job: it becomes an output row with `finish_reason=error` and a
message saying what was wrong, so the job goes on and every input row still has its output row.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from jinja2 import TemplateError
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


def chat_messages(value: object) -> list[dict[str, str]]:
    """One row's chat messages as `[{role, content}]`, from a list of structs or JSON text of one.

    Raises ValueError naming what is wrong (and where: `messages[2].content`), which becomes the
    row's error.
    """
    if value is None:
        raise ValueError("messages are null")
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"messages are not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, list):
        raise ValueError(f"messages must be a list of {{role, content}} objects, got {type(value).__name__}")
    if not value:
        raise ValueError("messages are an empty list")
    messages = []
    for k, message in enumerate(value):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{k}] must be a {{role, content}} object, got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing or null" if message.get(key) is None else type(message[key]).__name__
                raise ValueError(f"messages[{k}].{key} must be text, got {got}")
        if not message["role"].strip():
            raise ValueError(f"messages[{k}].role is empty")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def chat_prompts(tokenizer: PreTrainedTokenizerBase, values: list[object]) -> tuple[list[str | None], list[str | None]]:
    """Each row's prompt rendered through the tokenizer's chat template with the generation prompt added,
    and, where a row cannot be rendered, why (its text is then None).

    The template writes the special tokens it wants (e.g. BOS), so rendered prompts are tokenized
    without adding any.
    """
    texts: list[str | None] = []
    problems: list[str | None] = []
    for value in values:
        try:
            messages = chat_messages(value)
            texts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
            problems.append(None)
        except ValueError as exc:
            texts.append(None)
            problems.append(str(exc))
        except TemplateError as exc:  # the template itself refuses (e.g. roles out of order)
            texts.append(None)
            problems.append(f"the chat template refused the messages: {exc}")
    return texts, problems


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

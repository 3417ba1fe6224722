"""Prompt checks, stop strings and completion text on literal inputs."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from workers.rows import StopStrings, completion_text, prompt_problem, repetition_rate


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        (None, "null"),
        ("", "empty"),
        (" \n\t", "empty"),
        (b"\xff\xfe", "not valid UTF-8"),
        (3, "must be text"),
        ("def f():", None),
        (b"caf\xc3\xa9", None),
        ("汉字 🙂", None),
    ],
)
def test_prompt_problems(prompt, problem):
    found = prompt_problem(prompt)
    assert (found is None) if problem is None else (problem in found)


def test_stop_strings_detect_at_the_newest_token_and_cut_the_completion(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("return x\n\ndef g():")["input_ids"]
    stops = StopStrings(tokenizer, ["\ndef"])
    check = stops.for_row()
    hits = [check(ids[: n + 1]) for n in range(len(ids))]
    first = hits.index(True)
    assert "\ndef" in tokenizer.decode(ids[: first + 1]) and "\ndef" not in tokenizer.decode(ids[:first])
    assert completion_text(tokenizer, ids, ["\ndef"]) == "return x\n"
    assert StopStrings(tokenizer, []).for_row() is None


def test_repetition_rate_on_literal_tokens():
    assert repetition_rate([1, 2, 3, 4, 5, 6]) == 0.0
    assert repetition_rate([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(0.2)  # 1 of 5 4-grams seen before
    assert repetition_rate([1, 2]) == 0.0

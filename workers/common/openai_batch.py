"""The OpenAI Batch API's file shapes: request lines in, response lines out.

A request line is `{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}`. Its body's sampling fields become the row's own settings (`row_settings`); a field
accelgen cannot honour makes that row an error row naming the field, never the job. A response line
is `{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": <chat.completion or
text_completion>}, "error": null}`, or `{"id", "custom_id", "response": null, "error": {"code",
"message"}}` for a row that was not decoded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from workers.common.contract import FINISH_ERROR
from workers.common.json_lines import json_text
from workers.common.row_settings import LATER_SETTINGS, RowSettings, column_value, row_settings

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
# The columns a request's body fields are read into, by the row setting they set (their names are what
# a row's error message cites).
PARAMS_COLUMNS = {
    "max_new_tokens": "body.max_tokens",
    "temperature": "body.temperature",
    "top_p": "body.top_p",
    "stop": "body.stop",
    "seed": "body.seed",
    **{setting: f"body.{setting}" for setting in LATER_SETTINGS},
}
# OpenAI's presence_penalty, frequency_penalty, logit_bias and response_format, and vLLM's extra sampling
# fields of the same requests (repetition_penalty, min_p, min_tokens, stop_token_ids), with the same meanings.
_BODY_FIELDS = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "seed": "seed",
    **{setting: setting for setting in LATER_SETTINGS},
}
_HONOURED = frozenset({*_BODY_FIELDS, "max_completion_tokens"})
# Read elsewhere (prompt, messages, n), or not needed: the job's model.target decodes every row,
# whatever model the request names.
_READ_OR_IGNORED = frozenset({"prompt", "messages", "n", "model", "user", "metadata", "store", "service_tier"})
# Fields accepted only at a value that asks for nothing beyond what accelgen does.
_NEUTRAL = {
    "stream": (False,),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "best_of": (1,),
    "echo": (False,),
}
_FIXES = {
    "logprobs": "per-token log-probabilities are not written in the Batch API output",
    "top_logprobs": "per-token log-probabilities are not written in the Batch API output",
}
# What any row's settings are checked against: only the body's own values are kept.
_ANY = RowSettings(1, 0.0, 1.0, (), 0)


@dataclass
class Request:
    """One request line as a row: its prompt or messages, its settings, or why it is an error row."""

    custom_id: str | None = None
    chat: bool = False
    prompt: str | None = None
    messages: str | None = None  # JSON text of the messages, as `rows.chat_messages` reads them
    settings: dict[str, object] = field(default_factory=dict)  # setting -> value, checked
    problem: str | None = None


def parse_request(line: dict[str, Any], samples: int) -> Request:
    """A request line as a row (`samples`: the job's generation.n, which a request's `n` must equal)."""
    custom_id = line.get("custom_id")
    request = Request(custom_id=json_text(custom_id) if custom_id is not None else None)
    body, url = line.get("body"), line.get("url")
    if custom_id is None:
        request.problem = "the request has no custom_id"
    elif not isinstance(body, dict):
        request.problem = "the request has no body object"
    elif line.get("method", "POST") != "POST":
        request.problem = f"method {line.get('method')!r} is not supported: use POST"
    elif url not in (CHAT_URL, COMPLETIONS_URL):
        request.problem = f"url {url!r} is not supported: use {CHAT_URL} or {COMPLETIONS_URL}"
    else:
        request.chat = url == CHAT_URL
        request.problem = _body_problem(body, request, samples)
    return request


def _body_problem(body: dict[str, Any], request: Request, samples: int) -> str | None:
    for name, value in body.items():
        if name in _HONOURED or name in _READ_OR_IGNORED or value is None or value in _NEUTRAL.get(name, ()):
            continue
        why = _FIXES.get(name, "accelgen does not implement it")
        return f"body.{name} is not supported ({why}): remove it from the request"
    if body.get("n") is not None and body["n"] != samples:
        return f"body.n is {body['n']!r}: every row of this job is sampled generation.n={samples} times; remove n"
    if request.chat:
        if body.get("messages") is None:
            return f"a {CHAT_URL} request needs body.messages"
        request.messages = json_text(body["messages"])
    else:
        if not isinstance(body.get("prompt"), str):
            return f"a {COMPLETIONS_URL} request needs body.prompt as one string"
        request.prompt = body["prompt"]
    values = {setting: body.get(name) for name, setting in _BODY_FIELDS.items()}
    if body.get("max_completion_tokens") is not None:
        values["max_new_tokens"] = body["max_completion_tokens"]  # the chat API's newer name of max_tokens
    checked = row_settings(_ANY, values, PARAMS_COLUMNS, request.custom_id or "")
    if isinstance(checked, str):
        return checked
    request.settings = {s: column_value(checked, s) for s, v in values.items() if v is not None}
    return None


def response_line(rows: list[dict[str, Any]], chat: bool, model: str, job_id: str, created: int) -> dict[str, Any]:
    """The response line of one request: `rows` are its output rows (one per sample, sample order)."""
    first = rows[0]
    custom_id = first["row_id"]
    key = hashlib.sha256(f"{job_id}\x00{custom_id}".encode()).hexdigest()
    line: dict[str, Any] = {"id": f"batch_req_{key[:24]}", "custom_id": custom_id}
    if first["finish_reason"] == FINISH_ERROR:
        return {**line, "response": None, "error": {"code": "invalid_request", "message": first["error"]}}
    generated = sum(r["num_generated_tokens"] or 0 for r in rows)
    choices = [_choice(r, chat) for r in rows]
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{key[24:48]}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": first["num_prompt_tokens"],
            "completion_tokens": generated,
            "total_tokens": first["num_prompt_tokens"] + generated,
        },
    }
    response = {"status_code": 200, "request_id": key[48:], "body": body}
    return {**line, "response": response, "error": None}


def _choice(row: dict[str, Any], chat: bool) -> dict[str, Any]:
    content = {"message": {"role": "assistant", "content": row["completion"]}} if chat else {"text": row["completion"]}
    # Beyond the API's fields: what decoded the sample and how many tokens it took (`accelgen report`).
    extra = {"strategy": row["strategy"], "completion_tokens": row["num_generated_tokens"]}
    return {
        "index": row["sample_index"],
        **content,
        "finish_reason": row["finish_reason"],
        "logprobs": None,
        "accelgen": extra,
    }


def rows_of_response(line: dict[str, Any], samples: int) -> list[dict[str, Any]]:
    """The output rows a response line stands for (an error line: every sample of its row)."""
    custom_id = line["custom_id"]
    response = line.get("response")
    if response is None:
        message = (line.get("error") or {}).get("message")
        return [
            {
                "row_id": custom_id,
                "sample_index": s,
                "completion": None,
                "finish_reason": FINISH_ERROR,
                "error": message,
                "num_prompt_tokens": None,
                "num_generated_tokens": None,
                "strategy": None,
            }
            for s in range(samples)
        ]
    body = response["body"]
    rows = []
    for choice in body["choices"]:
        extra = choice.get("accelgen", {})
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        rows.append(
            {
                "row_id": custom_id,
                "sample_index": choice["index"],
                "completion": text,
                "finish_reason": choice["finish_reason"],
                "error": None,
                "num_prompt_tokens": body["usage"]["prompt_tokens"],
                "num_generated_tokens": extra.get("completion_tokens"),
                "strategy": extra.get("strategy"),
            }
        )
    return rows

"""Each row's prompt as text and as token ids, for units whose rows may mix plain prompts and chat
messages (a Batch API request file holds completion and chat requests side by side)."""

from __future__ import annotations

import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from workers.common.sections import InputConfig
from workers.json_input import REQUEST_MESSAGES
from workers.rows import chat_prompts, prompt_problem

NO_TEMPLATE = (
    "a chat request needs a chat template and the tokenizer of model.target has none (chat_template.jinja, "
    "or chat_template in tokenizer_config.json): add one to the model folder, or send a completion request"
)


def unit_prompts(
    tokenizer: PreTrainedTokenizerBase, table: pa.Table, config: InputConfig, chat: list[bool]
) -> tuple[list[object], list[str | None]]:
    """Each row's prompt (chat rows rendered through the tokenizer's chat template with the generation
    prompt), and why a row cannot be decoded (None: it can). `chat`: `json_input.chat_rows`."""
    if config.messages_column:
        return chat_prompts(tokenizer, table.column(config.messages_column).to_pylist())
    prompts: list[object] = table.column(config.prompt_column).to_pylist()
    problems = [prompt_problem(p) if not c else None for p, c in zip(prompts, chat, strict=True)]
    picked = [i for i, c in enumerate(chat) if c]
    if picked and not tokenizer.chat_template:
        for i in picked:
            problems[i] = NO_TEMPLATE
    elif picked:
        messages = table.column(REQUEST_MESSAGES).to_pylist()
        texts, why = chat_prompts(tokenizer, [messages[i] for i in picked])
        for i, text, problem in zip(picked, texts, why, strict=True):
            prompts[i], problems[i] = text, problem
    return prompts, problems


def encode(tokenizer: PreTrainedTokenizerBase, texts: dict[int, str], chat: list[bool]) -> dict[int, list[int]]:
    """Token ids of `texts` (row -> text). A chat template writes its own special tokens (e.g. BOS), so
    rendered prompts are tokenized without adding any; plain prompts get the tokenizer's."""
    encoded: dict[int, list[int]] = {}
    for rendered in (True, False):
        rows = [i for i in texts if chat[i] == rendered]
        if rows:
            ids = tokenizer([texts[i] for i in rows], add_special_tokens=not rendered)["input_ids"]
            encoded.update(zip(rows, ids, strict=True))
    return encoded

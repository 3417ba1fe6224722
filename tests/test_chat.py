"""Chat prompts (`input.messages_column`): messages checked row by row, rendered through the tokenizer's chat
template with the generation prompt, decoded end to end through `accelgen generate`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.cli import main as cli
from jobs.shipped import SHIPPED_TARGET
from workers.rows import chat_messages

CHATS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "import os\n"}],
]
# The shipped template (jobs/train/tokenizer.py) renders them so, BOS first, the generation prompt last.
RENDERED = [
    "<|endoftext|><|user|>\ndef add(a, b):\n<|assistant|>\n",
    "<|endoftext|><|system|>\nWrite Python.\n<|user|>\nimport os\n\n<|assistant|>\n",
]


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "messages are null"),
        ("[{'role': 'user'}]", "messages are not valid JSON (Expecting property name enclosed in double quotes"),
        ('{"role": "user", "content": "x"}', "messages must be a list of {role, content} objects, got dict"),
        ("[]", "messages are an empty list"),
        ('["hello"]', "messages[0] must be a {role, content} object, got str"),
        ('[{"role": "user", "content": "a"}, {"role": "user"}]', "messages[1].content must be text, got missing"),
        ([{"role": "user", "content": None}], "messages[0].content must be text, got missing or null"),
        ([{"role": 3, "content": "x"}], "messages[0].role must be text, got int"),
        ([{"role": " ", "content": "x"}], "messages[0].role is empty"),
    ],
)
def test_malformed_messages_are_named(value, problem):
    with pytest.raises(ValueError) as raised:
        chat_messages(value)
    assert str(raised.value).startswith(problem)


def test_messages_from_structs_and_from_json_are_the_same():
    structs = [{"role": "user", "content": "x", "name": None}]
    assert (
        chat_messages(structs)
        == chat_messages('[{"role": "user", "content": "x"}]')
        == [{"role": "user", "content": "x"}]
    )


def test_shipped_tokenizer_renders_the_documented_template():
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TARGET)
    for messages, text in zip(CHATS, RENDERED, strict=True):
        assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    for model in ("draft", "cllm"):
        folder = SHIPPED_TARGET.parent / model
        assert (folder / "chat_template.jinja").read_text() == (SHIPPED_TARGET / "chat_template.jinja").read_text()


def _generate(tmp_path: Path, column: list, model: Path, out: str) -> int:
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(column))], "messages": column}), tmp_path / "in.pq")
    return cli(
        [
            "generate",
            f"input.url={tmp_path / 'in.pq'}",
            f"output.url={tmp_path / out}",
            f"model.target={model}",
            "model.draft=null",
            "model.heads=null",
            "model.exits=null",
            "model.cmlm=null",
            "model.eagle=null",
            "model.dtype=float64",
            "input.id_column=id",
            "input.messages_column=messages",
            "input.prompt_column=absent",
            "generation.max_new_tokens=8",
        ]
    )


def _rows(out: Path) -> dict[str, dict]:
    manifest = json.loads((out / "_manifest.json").read_text())
    table = pa.concat_tables([pq.read_table(out / p["part"]) for p in manifest["parts"]])
    return {r["row_id"]: r for r in table.to_pylist()}


def test_chat_rows_decode_the_rendered_prompt_and_malformed_rows_are_error_rows(tmp_path):
    """Struct messages (with malformed rows among them) decode exactly what the target decodes from the
    rendered text, BOS once; a JSON text column goes the same way."""
    bad = [None, [], [{"role": "user", "content": None}]]
    assert _generate(tmp_path, [*CHATS, *bad], SHIPPED_TARGET, "structs") == 0
    rows = _rows(tmp_path / "structs")
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TARGET)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_TARGET, dtype=torch.float64)
    for i, text in enumerate(RENDERED):
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids[0, 0] == tokenizer.bos_token_id != ids[0, 1]
        with torch.inference_mode():
            expected = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
        row = rows[f"r{i}"]
        assert row["num_prompt_tokens"] == ids.shape[1]
        assert row["completion"] == tokenizer.decode(expected, skip_special_tokens=True)
        assert row["num_generated_tokens"] == len(expected) and row["finish_reason"] in ("stop", "length")
    errors = {rid: (r["finish_reason"], r["error"]) for rid, r in rows.items() if rid not in ("r0", "r1")}
    assert errors == {
        "r2": ("error", "messages are null"),
        "r3": ("error", "messages are an empty list"),
        "r4": ("error", "messages[0].content must be text, got missing or null"),
    }

    as_json = [json.dumps(m) for m in CHATS] + ["not json", '{"role": "user"}']
    assert _generate(tmp_path, as_json, SHIPPED_TARGET, "json") == 0
    json_rows = _rows(tmp_path / "json")
    assert [json_rows[f"r{i}"]["completion"] for i in range(2)] == [rows[f"r{i}"]["completion"] for i in range(2)]
    assert json_rows["r2"]["error"].startswith("messages are not valid JSON (Expecting value at character 0)")
    assert json_rows["r3"]["error"] == "messages must be a list of {role, content} objects, got dict"


def test_a_tokenizer_without_a_chat_template_fails_the_job_before_any_write(tmp_path, tiny_model_dir, capsys):
    assert _generate(tmp_path, CHATS, tiny_model_dir, "out") == 2
    assert "has no chat template" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_messages_column_of_the_wrong_type_fails_the_job(tmp_path, capsys):
    assert _generate(tmp_path, [[1, 2]], SHIPPED_TARGET, "out") == 2
    assert "must hold a list of structs with fields role and content" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

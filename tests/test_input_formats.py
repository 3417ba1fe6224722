"""JSON Lines and Batch API files without a job: format inference, the driver's scan and checks, the
actor's read of a unit, request lines as rows, and parts written and read back in every format."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from job_config import job_config

from pipeline.checks import validate
from pipeline.errors import JobError
from pipeline.input_formats import check_text_input, plan_input_units, resolve_format, scan_text_shards
from pipeline.shards import list_data_files
from workers.common.contract import OUTPUT_SCHEMA, derived_row_id, unit_id
from workers.common.json_lines import is_json_lines_name
from workers.common.openai_batch import parse_request
from workers.common.output_formats import ResponseContext, encode_part, read_part_rows
from workers.common.sections import GenerationConfig, InputConfig
from workers.json_input import ROW_ID, read_json_unit, row_problems


def _lines(path: Path, lines: list[str], compressed: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if compressed else data)


def _scan(folder: Path, input_format: str | None = None, rows_per_unit: int = 2, id_field: str | None = None):
    listing = list_data_files(str(folder), {})
    resolved = resolve_format(input_format, listing, str(folder))
    return resolved, scan_text_shards(listing, resolved, rows_per_unit, id_field, True)


def _spec(config: InputConfig, n: int = 1) -> SimpleNamespace:
    return SimpleNamespace(input=config, generation=GenerationConfig(n=n))


@pytest.mark.parametrize(
    ("name", "json_lines"),
    [
        ("a.jsonl", True),
        ("a.ndjson", True),
        ("a.json", True),
        ("a.jsonl.gz", True),
        ("a.json.xz", True),
        ("a.parquet", False),
        ("a.gz", False),
        ("jsonl", False),
    ],
)
def test_json_lines_names(name, json_lines):
    assert is_json_lines_name(name) is json_lines


def test_the_format_is_inferred_from_names_that_agree(tmp_path):
    _lines(tmp_path / "j" / "a.jsonl", ['{"prompt": "x"}'])
    _lines(tmp_path / "j" / "b.jsonl.gz", ['{"prompt": "y"}'], compressed=True)
    assert resolve_format(None, list_data_files(str(tmp_path / "j"), {}), "j") == "jsonl"
    (tmp_path / "j" / "c.parquet").write_bytes(b"")
    with pytest.raises(JobError, match=r"holds JSON Lines files \(a\.jsonl\) and others \(c\.parquet\).*input\.format"):
        resolve_format(None, list_data_files(str(tmp_path / "j"), {}), "j")
    assert resolve_format("openai_batch", list_data_files(str(tmp_path / "j"), {}), "j") == "openai_batch"
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "part-0").write_bytes(b"")  # a name of no format: Parquet, as every input was before
    assert resolve_format(None, list_data_files(str(tmp_path / "p"), {}), "p") == "parquet"


def test_a_plain_file_is_cut_at_line_starts_and_a_compressed_one_is_one_unit(tmp_path):
    rows = [json.dumps({"prompt": f"p{i}"}) for i in range(5)]
    _lines(tmp_path / "a.jsonl", [rows[0], "", rows[1], rows[2], "  ", rows[3], rows[4]])
    _lines(tmp_path / "b.jsonl.gz", rows[:3], compressed=True)
    _, shards = _scan(tmp_path)
    units = plan_input_units(shards, 2)
    assert [u.unit_id for u in units] == [unit_id(0, 0), unit_id(0, 1), unit_id(0, 2), unit_id(1, 0)]
    assert [(u.first_row, u.num_rows) for u in units] == [(0, 2), (3, 2), (6, 1), (0, 3)]
    assert units[3].byte_range is None and all(u.byte_range for u in units[:3])
    # Derived ids are the 0-based line numbers, blank lines counted: the same whatever the unit size.
    assert shards[0].row_ids == tuple(derived_row_id("a.jsonl", i) for i in (0, 2, 3, 5, 6))
    read = [read_json_unit(u, _spec(InputConfig(url=str(tmp_path)))) for u in units]
    assert [r for t in read for r in t.column(ROW_ID).to_pylist()] == [*shards[0].row_ids, *shards[1].row_ids]
    assert [p for t in read for p in t.column("prompt").to_pylist()] == [*(f"p{i}" for i in range(5)), "p0", "p1", "p2"]


def test_bad_lines_and_values_are_error_rows_naming_file_and_line(tmp_path):
    lines = [
        '{"prompt": "x", "t": 0.5, "keep": {"a": 1}}',
        "{not json",
        "[1, 2]",
        '{"prompt": 3}',
        '{"prompt": "y", "t": "hot", "keep": "k"}',
    ]
    _lines(tmp_path / "a.jsonl", lines)
    _, shards = _scan(tmp_path, rows_per_unit=10)
    config = InputConfig(url=str(tmp_path), keep_columns=["keep"], params_columns={"temperature": "t"})
    table = read_json_unit(plan_input_units(shards, 10)[0], _spec(config))
    problems = row_problems(table)
    assert sorted(problems) == [1, 2, 3, 4]
    assert problems[1].startswith(f"{tmp_path / 'a.jsonl'} line 2: not valid JSON")
    assert problems[2].endswith("line 3: a JSON list, not an object")
    assert problems[3] == "field 'prompt' must be text, got int"
    assert "input column 't' (temperature) is 'hot'" in problems[4]
    # Kept fields have one type: a string as it is, anything else as its JSON text.
    assert table.column("keep").to_pylist() == ['{"a": 1}', None, None, None, "k"]
    assert table.column("t").type == pa.float64()


def test_the_scan_refuses_missing_fields_and_null_or_duplicate_ids(tmp_path):
    _lines(tmp_path / "a.jsonl", ['{"text": "x", "id": 1}', '{"text": "y", "id": 2}'])
    _, shards = _scan(tmp_path, id_field="id")
    with pytest.raises(
        JobError, match=r"input\.prompt_column: field 'prompt' is not in the first JSON object .*text, id"
    ):
        check_text_input(shards, InputConfig(url="x", format="jsonl"))
    check_text_input(shards, InputConfig(url="x", format="jsonl", prompt_column="text", id_column="id"))
    _lines(tmp_path / "b.jsonl", ['{"text": "z", "id": 1}', '{"text": "w"}'])
    _, shards = _scan(tmp_path, id_field="id")
    with pytest.raises(JobError, match=r"input\.id_column 'id' is null or missing at .*b\.jsonl line 2"):
        check_text_input(shards, InputConfig(url="x", format="jsonl", prompt_column="text", id_column="id"))
    _lines(tmp_path / "b.jsonl", ['{"text": "z", "id": 1}'])
    _, shards = _scan(tmp_path, id_field="id")
    with pytest.raises(JobError, match=r"input\.id_column: 1 ids appear on more than one line, e\.g\. \['1'\]"):
        check_text_input(shards, InputConfig(url="x", format="jsonl", prompt_column="text", id_column="id"))


def _request(custom_id: str, **body: object) -> dict:
    chat = "messages" in body
    url = "/v1/chat/completions" if chat else "/v1/completions"
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "any", **body}}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}, "the request has no custom_id"),
        ({"custom_id": "a", "url": "/v1/completions"}, "the request has no body object"),
        ({**_request("a", prompt="x"), "url": "/v1/embeddings"}, "url '/v1/embeddings' is not supported"),
        (_request("a", prompt="x", response_format={"type": "xml"}), "'body.response_format' (response_format)"),
        (_request("a", prompt="x", logprobs=5), "body.logprobs is not supported"),
        (_request("a", prompt="x", n=2), "body.n is 2"),
        (_request("a", prompt=["x", "y"]), "needs body.prompt as one string"),
        (_request("a", messages=None), "needs body.messages"),
        (_request("a", prompt="x", temperature=-1), "input column 'body.temperature' (temperature) is -1"),
    ],
)
def test_requests_a_row_cannot_honour_name_why(line, problem):
    assert problem in (parse_request(line, samples=1).problem or "")


def test_a_requests_body_sets_the_rows_settings():
    request = parse_request(
        _request(
            "a",
            messages=[{"role": "user", "content": "x"}],
            max_completion_tokens=5,
            stop="\n",
            seed=3,
            temperature=0.5,
            response_format={"type": "text"},
            stream=False,
            user="u",
        ),
        samples=1,
    )
    assert request.problem is None and request.chat and json.loads(request.messages)[0]["content"] == "x"
    assert request.settings == {
        "max_new_tokens": 5,
        "temperature": 0.5,
        "stop": ["\n"],
        "seed": 3,
        "response_format": '{"type": "text"}',  # the job's format does not reach a request that asks for text
    }


def _output_rows(samples: int) -> pa.Table:
    rows = []
    for row_id, error in (("a", None), ("b", "bad prompt")):
        for s in range(samples):
            rows.append(
                {name: None for name in OUTPUT_SCHEMA.names}
                | {"row_id": row_id, "sample_index": s, "error": error}
                | (
                    {"finish_reason": "error"}
                    if error
                    else {
                        "completion": f"c{s}",
                        "finish_reason": "length",
                        "num_prompt_tokens": 4,
                        "num_generated_tokens": 2,
                        "strategy": "autoregressive",
                    }
                )
            )
    return pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA)


@pytest.mark.parametrize("output_format", ["parquet", "jsonl", "openai_batch"])
def test_every_part_format_reads_back_as_the_contracts_columns(output_format):
    table = _output_rows(samples=2)
    context = ResponseContext([True, False], "model", "job")
    data = encode_part(table, output_format, context)
    columns = ["row_id", "sample_index", "completion", "finish_reason", "error", "strategy", "num_generated_tokens"]
    assert read_part_rows(data, output_format, columns, samples=2).to_pylist() == table.select(columns).to_pylist()


def test_batch_response_lines_have_the_apis_shape():
    data = encode_part(_output_rows(samples=2), "openai_batch", ResponseContext([True, False], "model", "job"))
    ok, failed = (json.loads(line) for line in data.decode().splitlines())
    assert ok["id"].startswith("batch_req_") and ok["custom_id"] == "a" and ok["error"] is None
    body = ok["response"]["body"]
    assert ok["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert [c["message"] for c in body["choices"]] == [{"role": "assistant", "content": f"c{s}"} for s in range(2)]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert failed["response"] is None and failed["error"]["message"] == "bad prompt"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["input.format=csv"], "input.format must be one of parquet, jsonl, openai_batch"),
        (["output.format=csv"], "output.format must be one of parquet, jsonl, openai_batch"),
        (
            ["input.format=openai_batch", "input.id_column=id"],
            "input.id_column does not apply to input.format=openai_batch",
        ),
        (["output.format=openai_batch", "input.keep_columns=[n]"], "input.keep_columns: output.format=openai_batch"),
        (
            ["output.format=openai_batch", "output.logprobs=true"],
            "output.logprobs is not written in output.format=openai_batch",
        ),
    ],
)
def test_format_keys_that_cannot_work_are_refused_naming_the_key(tmp_path, overrides, message):
    with pytest.raises(JobError, match="invalid config") as raised:
        validate(job_config(tmp_path, tmp_path / "model", *overrides))
    assert message in str(raised.value)


def test_request_files_refuse_duplicate_custom_ids_and_read_bad_lines_as_error_rows(tmp_path):
    good = json.dumps(_request("a", prompt="x", max_tokens=3))
    _lines(tmp_path / "r.jsonl", [good, "{broken", json.dumps({"body": {"prompt": "y"}})])
    _, shards = _scan(tmp_path, "openai_batch", rows_per_unit=10)
    check_text_input(shards, InputConfig(url="x", format="openai_batch"))
    assert shards[0].row_ids == ("a", "r.jsonl#1", "r.jsonl#2")
    table = read_json_unit(plan_input_units(shards, 10)[0], _spec(InputConfig(url="x", format="openai_batch")))
    assert table.column("body.max_tokens").to_pylist() == [3, None, None]
    problems = row_problems(table)
    assert sorted(problems) == [1, 2] and problems[2].endswith("r.jsonl line 3: the request has no custom_id")
    _lines(tmp_path / "s.jsonl", [good])
    _, shards = _scan(tmp_path, "openai_batch")
    with pytest.raises(JobError, match=r"custom_id: 1 ids appear on more than one line, e\.g\. \['a'\]"):
        check_text_input(shards, InputConfig(url="x", format="openai_batch"))

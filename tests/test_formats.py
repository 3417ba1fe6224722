"""Jobs over JSON Lines and OpenAI Batch request files, writing JSONL and Batch response parts: the
same rows, ids, resume and checks as Parquet jobs, on a tiny model and an embedded Ray."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from job_config import job_config
from s3_server import CREDENTIALS, MotoS3
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.commit import commit_record_name
from pipeline.driver import run_job
from pipeline.errors import JobError
from pipeline.report import read_job
from pipeline.verify import verify
from workers.common.contract import part_name, unit_id

PROMPTS = ["def add(a, b):", "import os\nimport sys\n", "x", "for i in range(10):", "return", "class A:"]
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    ray.shutdown()
    yield
    ray.shutdown()


def _rows() -> list[dict]:
    return [{"id": f"r{i}", "prompt": p, "n": i} for i, p in enumerate(PROMPTS)]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _config(tmp_path: Path, model: Path, source: str, out: str, *extra: str):
    return job_config(
        tmp_path,
        model,
        f"input.url={tmp_path / source}",
        f"output.url={tmp_path / out}",
        "model.dtype=float64",
        "input.id_column=id",
        "input.keep_columns=[n]",
        "input.rows_per_unit=2",
        "generation.max_new_tokens=8",
        "generation.ignore_eos=true",
        "workers.batch_size=3",
        *extra,
    )


def _parquet_rows(out: Path) -> dict[str, dict]:
    manifest = json.loads((out / "_manifest.json").read_text())
    return {r["row_id"]: r for p in manifest["parts"] for r in pq.read_table(out / p["part"]).to_pylist()}


def _jsonl_rows(out: Path) -> dict[str, dict]:
    manifest = json.loads((out / "_manifest.json").read_text())
    lines = [line for p in manifest["parts"] for line in (out / p["part"]).read_text().splitlines()]
    return {row["row_id"]: row for row in map(json.loads, lines)}


def _part_hashes(out: Path) -> dict[str, str]:
    return {p["part"]: p["sha256"] for p in json.loads((out / "_manifest.json").read_text())["parts"]}


def test_jsonl_and_gzipped_jsonl_jobs_write_what_the_parquet_job_writes(tmp_path, tiny_model_dir):
    (tmp_path / "parquet").mkdir()
    pq.write_table(pa.Table.from_pylist(_rows()), tmp_path / "parquet" / "rows.parquet", row_group_size=2)
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "rows.jsonl").write_bytes(_jsonl(_rows()))
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "rows.jsonl.gz").write_bytes(gzip.compress(_jsonl(_rows())))
    for source, out_format in (("parquet", "parquet"), ("jsonl", "jsonl"), ("gz", "parquet")):
        config = _config(tmp_path, tiny_model_dir, source, f"out-{source}", f"output.format={out_format}")
        assert run_job(config).status == "succeeded"
        report = verify(str(tmp_path / f"out-{source}"), str(tmp_path / source), {})
        assert report.ok and report.rows == len(PROMPTS), report.problems
    reference = _parquet_rows(tmp_path / "out-parquet")
    assert sorted(reference) == [f"r{i}" for i in range(len(PROMPTS))]
    for rows in (_jsonl_rows(tmp_path / "out-jsonl"), _parquet_rows(tmp_path / "out-gz")):
        assert {k: r["completion"] for k, r in rows.items()} == {k: r["completion"] for k, r in reference.items()}
        assert all(rows[k]["num_generated_tokens"] == 8 for k in rows)
    # Kept JSON fields are text: a number as its JSON text.
    assert _jsonl_rows(tmp_path / "out-jsonl")["r2"]["n"] == "2"
    # A plain file is split by rows_per_unit into parts named as Parquet ones are, with their format's suffix.
    assert sorted(_part_hashes(tmp_path / "out-jsonl")) == [part_name(unit_id(0, k), ".jsonl") for k in range(3)]
    assert list(_part_hashes(tmp_path / "out-gz")) == [part_name(unit_id(0, 0))]
    # The report reads JSONL parts as it reads Parquet ones.
    job = read_job(str(tmp_path / "out-jsonl"), {})
    assert job.rows.num_rows == len(PROMPTS) and set(job.rows.column("strategy").to_pylist()) == {"autoregressive"}
    # A stray or altered JSONL part is found as a Parquet one would be.
    part = tmp_path / "out-jsonl" / part_name(unit_id(0, 1), ".jsonl")
    part.write_text(part.read_text().replace('"sample_index": 0', '"sample_index": 0 '))
    assert "checksum differs" in " ".join(verify(str(tmp_path / "out-jsonl"), None, {}).problems)


def test_a_jsonl_job_resumed_after_an_interruption_commits_each_row_once(tmp_path, tiny_model_dir):
    """Derived ids (no id field): line numbers, stable across runs; the resumed parts are the same bytes."""
    (tmp_path / "in").mkdir()
    rows = [{"prompt": p} for p in PROMPTS]
    (tmp_path / "in" / "a.jsonl").write_bytes(_jsonl(rows[:4]) + b"\n" + _jsonl(rows[4:]))  # a blank line
    config = _config(tmp_path, tiny_model_dir, "in", "out", "input.id_column=null", "input.keep_columns=[]")
    config.output.format = "jsonl"
    assert run_job(config).status == "succeeded"
    out = tmp_path / "out"
    reference = _part_hashes(out)
    assert sorted(_jsonl_rows(out)) == [f"a.jsonl#{i}" for i in (0, 1, 2, 3, 5, 6)]
    for unit in (unit_id(0, 0), unit_id(0, 2)):  # an interruption: two units never committed
        (out / part_name(unit, ".jsonl")).unlink()
        (out / commit_record_name(unit)).unlink()
    (out / "_SUCCESS").unlink()
    (out / "_manifest.json").unlink()
    outcome = run_job(config)
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 4
    assert _part_hashes(out) == reference
    report = verify(str(out), str(tmp_path / "in"), {})
    assert report.ok and report.rows == len(PROMPTS), report.problems
    assert run_job(config).status == "already_complete"
    config.output.format = "parquet"  # another format makes another job
    with pytest.raises(JobError, match="different job"):
        run_job(config)


def _chat_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    model = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return model


def _requests() -> list[str]:
    chat = {"role": "user", "content": "def add(a, b):"}
    lines = [
        {
            "custom_id": "chat-1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [chat], "max_tokens": 5},
        },
        {
            "custom_id": "text-1",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "gpt-3.5-turbo-instruct", "prompt": "import os\n", "max_tokens": 3, "temperature": 0},
        },
        {
            "custom_id": "structured",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [chat], "response_format": {"type": "json_object"}},
        },
    ]
    return [json.dumps(lines[0]), json.dumps(lines[1]), '{"custom_id": "broken", "body": ', json.dumps(lines[2])]


def _read_batch_output(folder: Path) -> dict[str, dict]:
    """What a user of the Batch API does with an output file: every line is one JSON object; index by custom_id."""
    by_id = {}
    for path in sorted(folder.glob("part-*.jsonl")):
        for line in path.read_text().splitlines():
            result = json.loads(line)
            by_id[result["custom_id"]] = result
    return by_id


def test_an_openai_batch_file_in_and_out(tmp_path, tiny_model_dir):
    model = _chat_model(tiny_model_dir, tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "requests.jsonl").write_text("\n".join(_requests()) + "\n")
    config = _config(
        tmp_path,
        model,
        "in",
        "out",
        "input.id_column=null",
        "input.keep_columns=[]",
        "input.format=openai_batch",
        "output.format=openai_batch",
    )
    assert run_job(config).status == "succeeded"
    results = _read_batch_output(tmp_path / "out")
    assert sorted(results) == ["chat-1", "requests.jsonl#2", "structured", "text-1"]

    tokenizer = AutoTokenizer.from_pretrained(model)
    target = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64)

    def greedy(ids: list[int], tokens: int) -> str:
        out = target.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)

    chat, text = results["chat-1"], results["text-1"]
    for result in (chat, text):
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["id"].startswith("batch_req_") and result["response"]["request_id"]
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "def add(a, b):"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert body["choices"][0]["message"]["content"] == greedy(prompt_ids, 5)
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 5,
        "total_tokens": len(prompt_ids) + 5,
    }
    body = text["response"]["body"]
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["text"] == greedy(tokenizer("import os\n")["input_ids"], 3)
    assert body["choices"][0]["finish_reason"] == "length"
    broken, structured = results["requests.jsonl#2"], results["structured"]
    assert broken["response"] is None and "requests.jsonl line 3: not valid JSON" in broken["error"]["message"]
    assert structured["error"] is None  # a JSON object, as the request's response_format asks
    choice = structured["response"]["body"]["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    report = verify(str(tmp_path / "out"), str(tmp_path / "in"), {})
    assert report.ok and report.rows == 4, report.problems
    assert read_job(str(tmp_path / "out"), {}).rows.column("finish_reason").to_pylist().count("error") == 1


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    server.start()
    yield server
    server.stop()


def test_jsonl_and_gzipped_jsonl_on_s3(s3, tiny_model_dir, tmp_path):
    options = {**CREDENTIALS, "client_kwargs": {"endpoint_url": s3.endpoint}}
    fs = fsspec.filesystem("s3", **options)
    fs.mkdir("formats")
    fs.pipe_file("formats/in/a.jsonl", _jsonl(_rows()[:4]))
    fs.pipe_file("formats/in/b.jsonl.gz", gzip.compress(_jsonl(_rows()[4:])))
    config = _config(tmp_path, tiny_model_dir, "unused", "unused", "output.format=jsonl")
    config.input.url, config.output.url = "s3://formats/in", "s3://formats/out"
    config.input.storage_options = config.output.storage_options = options
    assert run_job(config).status == "succeeded"
    report = verify("s3://formats/out", "s3://formats/in", options)
    assert report.ok and report.rows == len(PROMPTS) and report.parts == 3, report.problems

"""Bad input, tried: every case ends as an error row with a message, or a clear job error before any
write — never a crash mid-job, a hang, or a lost row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from job_config import job_config
from transformers import AutoConfig, AutoTokenizer

from jobs.cli import main as cli
from pipeline.driver import run_job
from pipeline.errors import JobError
from pipeline.verify import verify


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def _text_of_tokens(tokenizer, n: int) -> str:
    """A prompt that encodes to exactly n tokens: a character the tokenizer never merges with itself,
    repeated (the first one found among a few candidates)."""
    for char in ["~", "@", "#", "$", "^", "`", "|", "é", "ü", "x"]:
        for width in range(n - 10, n + 10):
            text = char * width
            if len(tokenizer(text)["input_ids"]) == n:
                return text
    raise AssertionError(f"no prompt of {n} tokens")


def _config(tmp_path: Path, model: Path, *extra: str):
    return job_config(tmp_path, model, "generation.max_new_tokens=4", "input.id_column=id", *extra)


def test_bad_rows_become_error_rows(tmp_path, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    context = AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings
    # (id, prompt bytes or None, expected: "error: <fragment>" or a finish reason)
    cases = [
        ("empty", b"", "error: empty"),
        ("null", None, "error: null"),
        ("whitespace", b" \t\n ", "error: empty"),
        ("invalid_utf8", b"\xff\xfe\xfd", "error: not valid UTF-8"),
        ("nul_and_controls", b"a\x00b\x01c\x1b[31m", "length"),
        ("special_tokens", b"<|endoftext|>def f(): <|endoftext|>", "decoded"),
        ("cjk_emoji", "汉字かなカナ 한국어 🙂🚀".encode(), "length"),
        ("context_minus_1", _text_of_tokens(tokenizer, context - 1).encode(), "length"),
        ("context", _text_of_tokens(tokenizer, context).encode(), "error: leaving no room"),
        ("context_plus_1", _text_of_tokens(tokenizer, context + 1).encode(), "error: leaving no room"),
    ]
    (tmp_path / "in").mkdir()
    table = pa.table({"id": [c[0] for c in cases], "prompt": pa.array([c[1] for c in cases], pa.binary())})
    pq.write_table(table, tmp_path / "in" / "mixed.parquet")
    all_bad = pa.table({"id": ["b1", "b2"], "prompt": pa.array([None, b"   "], pa.binary())})
    pq.write_table(all_bad, tmp_path / "in" / "all-bad.parquet")
    pq.write_table(table.slice(0, 0), tmp_path / "in" / "zero-rows.parquet")

    assert run_job(_config(tmp_path, tiny_model_dir)).status == "succeeded"
    report = verify(str(tmp_path / "out"), str(tmp_path / "in"), {})
    assert report.ok and report.rows == len(cases) + 2, report.problems
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    rows = {r["row_id"]: r for p in manifest["parts"] for r in pq.read_table(tmp_path / "out" / p["part"]).to_pylist()}
    for row_id, _, expected in cases:
        row = rows[row_id]
        if expected.startswith("error: "):
            assert row["finish_reason"] == "error" and expected.removeprefix("error: ") in row["error"], row
        elif expected == "decoded":
            assert row["finish_reason"] in ("stop", "length") and row["error"] is None, row
        else:
            assert row["finish_reason"] == expected and row["error"] is None, row
    assert rows["context_minus_1"]["num_generated_tokens"] == 1
    assert rows["b1"]["finish_reason"] == rows["b2"]["finish_reason"] == "error"


def _write(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("max_new_tokens_zero", "generation.max_new_tokens must be > 0"),
        ("max_new_tokens_negative", "generation.max_new_tokens must be > 0"),
        ("duplicate_ids", "duplicate ids"),
        ("corrupt_parquet", "cannot read the Parquet footer of"),
        ("missing_column", "input.prompt_column: column 'prompt' is not in"),
        ("mismatched_schemas", "differs from"),
    ],
)
def test_bad_jobs_fail_before_writing(case, message, tmp_path, tiny_model_dir):
    good = pa.table({"id": ["a", "b"], "prompt": ["x", "y"]})
    _write(tmp_path / "in" / "0.parquet", good)
    extra: list[str] = []
    if case == "max_new_tokens_zero":
        extra = ["generation.max_new_tokens=0"]
    elif case == "max_new_tokens_negative":
        extra = ["generation.max_new_tokens=-3"]
    elif case == "duplicate_ids":
        _write(tmp_path / "in" / "1.parquet", pa.table({"id": ["c", "a"], "prompt": ["z", "w"]}))
    elif case == "corrupt_parquet":
        (tmp_path / "in" / "1.parquet").write_bytes(b"PAR1 this is not a parquet file")
    elif case == "missing_column":
        _write(tmp_path / "in" / "0.parquet", pa.table({"id": ["a"], "text": ["x"]}))
    elif case == "mismatched_schemas":
        _write(tmp_path / "in" / "1.parquet", pa.table({"id": [1], "prompt": ["z"]}))
    with pytest.raises(JobError, match=message):
        run_job(_config(tmp_path, tiny_model_dir, *extra))
    assert not (tmp_path / "out").exists()


def test_a_refused_job_stops_ray_before_its_message(tmp_path, tiny_model_dir, capsys):
    """The actors start while the input is checked; refusing the job kills them mid-start, which Ray's
    processes report a little later. `accelgen generate` stops Ray (quietly) before it prints why the
    job was refused, so the command's output ends with what the user must fix."""
    _write(tmp_path / "in" / "a.parquet", pa.table({"prompt": [1, 2, 3]}))
    args = [
        f"input.url={tmp_path / 'in'}",
        f"output.url={tmp_path / 'out'}",
        f"model.target={tiny_model_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
    ]
    assert cli(["generate", *args]) == 2
    assert not ray.is_initialized()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: input.prompt_column 'prompt' of ") and last.endswith("is int64, not text"), last
    assert not (tmp_path / "out").exists()

"""End-to-end jobs on an embedded Ray with a tiny model: the output contract, bad rows, resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from job_config import job_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.cli import default_job_config
from pipeline.commit import commit_record_name
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.errors import JobError
from pipeline.verify import verify
from workers.contract import derived_row_id, part_name, unit_id

GOOD = [
    "def add(a, b):",
    "import os\nimport sys\n",
    "x",
    "class Stack:\n    def push(self, item):\n        self.items.append(",
    "for i in range(10):",
    "return",
]
BAD = {"null": None, "empty": "", "blank": "  \n\t ", "too_long": "word " * 200}


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def _write_input(folder: Path) -> dict[str, str | None]:
    """Three shards (one split into row groups); returns prompt by id."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(f"good-{i}", p) for i, p in enumerate(GOOD)] + [(f"bad-{k}", v) for k, v in BAD.items()]
    shards = [rows[0:4], rows[4:8], rows[8:]]
    for n, shard in enumerate(shards):
        table = pa.table({"id": [r[0] for r in shard], "prompt": [r[1] for r in shard], "n": [n] * len(shard)})
        pq.write_table(table, folder / f"shard-{n}.parquet", row_group_size=2)
    return dict(rows)


def _config(tmp_path: Path, model: Path, *extra: str):
    return job_config(
        tmp_path,
        model,
        "model.dtype=float64",
        "input.id_column=id",
        "input.keep_columns=[n]",
        "input.rows_per_unit=2",
        "generation.max_new_tokens=12",
        "generation.ignore_eos=true",
        "workers.batch_size=3",
        *extra,
    )


def _read_output(out: Path) -> pa.Table:
    manifest = json.loads((out / "_manifest.json").read_text())
    return pa.concat_tables([pq.read_table(out / p["part"]) for p in manifest["parts"]])


def _read_logs(out: Path) -> list[dict]:
    return [json.loads(line) for f in (out / "_logs").rglob("*.jsonl") for line in f.read_text().splitlines()]


def _part_hashes(out: Path) -> dict[str, str]:
    return {p["part"]: p["sha256"] for p in json.loads((out / "_manifest.json").read_text())["parts"]}


def test_job_output_contract_and_oracle(tmp_path, tiny_model_dir):
    prompts = _write_input(tmp_path / "in")
    outcome = run_job(_config(tmp_path, tiny_model_dir))
    assert outcome.status == "succeeded"
    out = tmp_path / "out"
    assert (out / "_SUCCESS").exists() and not (out / "_staging").exists()
    rows = {r["row_id"]: r for r in _read_output(out).to_pylist()}
    assert sorted(rows) == sorted(prompts)  # exactly one output row per input row
    for key in BAD:
        row = rows[f"bad-{key}"]
        assert row["finish_reason"] == "error" and row["error"] and row["completion"] is None
    assert "leaving no room to generate" in rows["bad-too_long"]["error"]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for i, prompt in enumerate(GOOD):
        row = rows[f"good-{i}"]
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert row["completion"] == tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
        assert row["finish_reason"] == "length" and row["num_generated_tokens"] == 12
        assert row["num_prompt_tokens"] == ids.shape[1] and row["strategy"] == "autoregressive"
        assert row["n"] == (0 if i < 4 else 1)

    logs = [
        json.loads(line) for f in (out / "_logs" / "batches").rglob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert sum(r["generated_tokens"] for r in logs) == 12 * len(GOOD)
    assert {
        "job_id",
        "unit_id",
        "attempt",
        "actor",
        "device",
        "strategy",
        "batch_size",
        "wall_s",
        "tokens_per_s",
    } <= set(logs[0])
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["versions"]["torch"] and manifest["identity"]["model"]["weights_sha256"]["target"]

    assert run_job(_config(tmp_path, tiny_model_dir)).status == "already_complete"
    with pytest.raises(JobError, match="different job"):
        run_job(_config(tmp_path, tiny_model_dir, "generation.max_new_tokens=5"))
    # Actor count and batch size are not part of the job's identity.
    assert run_job(_config(tmp_path, tiny_model_dir, "workers.batch_size=1")).status == "already_complete"


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    assert run_job(_config(tmp_path, tiny_model_dir)).status == "succeeded"
    out = tmp_path / "out"
    reference = _part_hashes(out)
    # An interruption: two units never committed, no manifest, no _SUCCESS.
    for unit in (unit_id(0, 0), unit_id(2, 0)):
        (out / part_name(unit)).unlink()
        (out / commit_record_name(unit)).unlink()
    (out / "_SUCCESS").unlink()
    (out / "_manifest.json").unlink()
    outcome = run_job(_config(tmp_path, tiny_model_dir, "workers.batch_size=2"))
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 4
    assert _part_hashes(out) == reference


def test_corrupt_shard_fails_its_unit_only_and_rerun_resumes(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    shard = tmp_path / "in" / "shard-2.parquet"  # one unit
    failed = unit_id(2, 0)
    good_bytes = shard.read_bytes()
    meta = pq.ParquetFile(shard).metadata
    corrupt = bytearray(good_bytes)
    start = meta.row_group(0).column(1).data_page_offset  # prompt column of the first row group
    corrupt[start : start + 40] = b"\xab" * 40
    shard.write_bytes(bytes(corrupt))
    outcome = run_job(_config(tmp_path, tiny_model_dir))
    out = tmp_path / "out"
    assert outcome.status == "failed" and not (out / "_SUCCESS").exists()
    assert list(outcome.summary["failed_units"]) == [failed]
    assert "shard-2.parquet" in outcome.summary["failed_units"][failed]
    assert (out / part_name(unit_id(0, 0))).exists()
    # Fixing the file changes its stamp; the job still resumes, since no unit of it was committed.
    shard.write_bytes(good_bytes)
    outcome = run_job(_config(tmp_path, tiny_model_dir))
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2
    # A shard that changes after its units were committed makes a different job.
    (tmp_path / "in" / "shard-0.parquet").touch()
    with pytest.raises(JobError, match="different job"):
        run_job(_config(tmp_path, tiny_model_dir))


def test_actors_that_cannot_be_scheduled_fail_the_job_quickly(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    with pytest.raises(JobError, match="reserves 64 CPUs"):
        run_job(_config(tmp_path, tiny_model_dir, "workers.num_actors=64"))
    config = _config(
        tmp_path, tiny_model_dir, "workers.custom_resources={no_such_node: 1}", "workers.actor_start_timeout_s=3"
    )
    with pytest.raises(JobError, match=r"not running after workers\.actor_start_timeout_s=3s"):
        run_job(config)


def test_speculative_jobs_greedy_equal_and_sampling_runs(tmp_path, tiny_model_dir, tiny_draft_dir):
    _write_input(tmp_path / "in")
    assert run_job(_config(tmp_path, tiny_model_dir)).status == "succeeded"
    greedy = {r["row_id"]: r["completion"] for r in _read_output(tmp_path / "out").to_pylist()}
    spec = [
        f"model.draft={tiny_draft_dir}",
        "strategy.name=speculative",
        "strategy.num_speculative_tokens=3",
        "strategy.adaptive=false",  # every row decoded by speculation itself, whatever it gains
    ]
    config = _config(tmp_path, tiny_model_dir, *spec, f"output.url={tmp_path / 'spec'}")
    assert run_job(config).status == "succeeded"
    rows = _read_output(tmp_path / "spec").to_pylist()
    assert {r["row_id"]: r["completion"] for r in rows} == greedy
    assert {r["strategy"] for r in rows if r["finish_reason"] != "error"} == {"speculative"}
    metrics = {"draft_tokens", "accepted_tokens", "acceptance_by_position", "tau", "tau_by_drafter"}
    assert all(metrics <= set(r) for r in _read_logs(tmp_path / "spec"))

    sampled = _config(tmp_path, tiny_model_dir, *spec, "generation.temperature=0.8", f"output.url={tmp_path / 's'}")
    assert run_job(sampled).status == "succeeded"
    assert len(_read_output(tmp_path / "s")) == len(rows)
    with pytest.raises(JobError, match="needs a draft model"):
        run_job(
            _config(
                tmp_path,
                tiny_model_dir,
                "strategy.name=speculative",
                "model.draft=null",
                f"output.url={tmp_path / 'x'}",
            )
        )


def test_rows_pick_their_strategy_and_auto_equals_greedy(tmp_path, tiny_model_dir, tiny_draft_dir):
    (tmp_path / "in").mkdir()
    prompts = ["def f(x):", "import os", "class A:", "for i in range(3):", "x = 1", "return x"]
    chosen = ["lookahead", None, "prompt_lookup", "nonsense", "autoregressive", "speculative"]
    pq.write_table(pa.table({"prompt": prompts, "how": chosen}), tmp_path / "in" / "a.parquet")
    base = [
        f"input.url={tmp_path / 'in'}",
        f"model.target={tiny_model_dir}",
        f"model.draft={tiny_draft_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.dtype=float64",
        "generation.max_new_tokens=10",
    ]
    plain = load_config(default_job_config(), None, [*base, f"output.url={tmp_path / 'plain'}"])
    assert run_job(plain).status == "succeeded"
    greedy = {r["row_id"]: r["completion"] for r in _read_output(tmp_path / "plain").to_pylist()}

    picked = load_config(
        default_job_config(), None, [*base, f"output.url={tmp_path / 'picked'}", "input.strategy_column=how"]
    )
    assert run_job(picked).status == "succeeded"
    rows = {r["row_id"]: r for r in _read_output(tmp_path / "picked").to_pylist()}
    bad = rows[derived_row_id("a.parquet", 3)]
    assert bad["finish_reason"] == "error" and "unknown strategy 'nonsense'" in bad["error"]
    for row_id, row in rows.items():
        if row_id != derived_row_id("a.parquet", 3):
            assert row["completion"] == greedy[row_id]
    assert rows[derived_row_id("a.parquet", 4)]["strategy"] == "autoregressive"

    auto = load_config(default_job_config(), None, [*base, f"output.url={tmp_path / 'auto'}", "strategy.name=auto"])
    assert run_job(auto).status == "succeeded"
    rows = _read_output(tmp_path / "auto").to_pylist()
    assert {r["row_id"]: r["completion"] for r in rows} == greedy
    assert all("switches" in r for r in _read_logs(tmp_path / "auto"))


def test_output_inside_the_input_folder_across_reruns_and_resumes(tmp_path, tiny_model_dir):
    prompts = _write_input(tmp_path / "in")
    (tmp_path / "in" / ".DS_Store").write_bytes(b"not parquet")
    (tmp_path / "in" / "_SUCCESS").write_text("")
    out = tmp_path / "in" / "out"
    config = _config(tmp_path, tiny_model_dir, f"output.url={out}")
    assert run_job(config).status == "succeeded"
    reference = _part_hashes(out)
    assert run_job(config).status == "already_complete"
    for _ in range(2):  # an interruption after the first commits, resumed: twice over
        for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(1, 0))):
            (out / name).unlink()
        outcome = run_job(config)
        assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2
    assert _part_hashes(out) == reference
    assert run_job(config).status == "already_complete"
    report = verify(str(out), str(tmp_path / "in"), {})
    assert report.ok and report.rows == len(prompts), report.problems


def test_resume_over_a_changed_listing(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    config = _config(tmp_path, tiny_model_dir)
    assert run_job(config).status == "succeeded"
    out = tmp_path / "out"
    for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(2, 0))):
        (out / name).unlink()
    # Files that are not data (named _* or .*) may come and go: the listing does not change.
    extra = pa.table({"id": ["z"], "prompt": ["x"], "n": [9]})
    pq.write_table(extra, tmp_path / "in" / ".shard-9.parquet")
    (tmp_path / "in" / "_tmp").mkdir()
    pq.write_table(extra, tmp_path / "in" / "_tmp" / "shard-9.parquet")
    # A shard added (or removed) renumbers the units: a different job, and the refusal says why.
    pq.write_table(extra, tmp_path / "in" / "shard-3.parquet")
    with pytest.raises(JobError, match=r"1 input shards added \(shard-3\.parquet\)"):
        run_job(config)
    (tmp_path / "in" / "shard-3.parquet").unlink()
    (tmp_path / "in" / "shard-2.parquet").touch()  # changed, but none of its units is committed
    outcome = run_job(config)
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2

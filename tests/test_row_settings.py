"""Per-row settings: columns override max_new_tokens, temperature, top_p, stop and seed row by row; a
bad value makes an error row naming the row, the column and the fix; a row's own seed is exact."""

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

from pipeline.driver import run_job
from pipeline.errors import JobError
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams, keyed_uniform, row_key, seeded_key
from workers.common.contract import derived_row_id, part_name, unit_id
from workers.common.row_settings import RowSettings, row_settings

JOB = RowSettings(max_new_tokens=6, temperature=0.0, top_p=1.0, stop=(), seed=0)
COLUMNS = {"max_new_tokens": "n", "temperature": "t", "top_p": "p", "stop": "s", "seed": "seed"}


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def test_values_override_nulls_keep_the_job_and_bad_values_say_where_and_how():
    values = {"max_new_tokens": 3, "temperature": 0.5, "top_p": None, "stop": ["\n"], "seed": 9}
    assert row_settings(JOB, values, COLUMNS, "r") == RowSettings(3, 0.5, 1.0, ("\n",), 9)
    assert row_settings(JOB, dict.fromkeys(COLUMNS), COLUMNS, "r") == JOB
    assert row_settings(JOB, {"stop": "END", "max_new_tokens": 4.0}, COLUMNS, "r").stop == ("END",)
    bad = {
        "max_new_tokens": [0, 2.5, True, "8"],
        "temperature": [-0.1, float("nan"), "hot"],
        "top_p": [0.0, 1.5],
        "stop": [[1, 2], 3],
        "seed": [1.5, 1 << 64],
    }
    for setting, wrong in bad.items():
        for value in wrong:
            message = row_settings(JOB, {setting: value}, COLUMNS, "row-7")
            assert isinstance(message, str), (setting, value)
            assert message.startswith(f"row row-7: input column {COLUMNS[setting]!r} ({setting}) is {value!r}: use ")
            assert message.endswith(f"or null for the job's generation.{setting}")


def test_a_rows_own_seed_draws_what_a_job_with_that_seed_draws():
    keys, positions = torch.tensor([row_key("a"), row_key("b")]), torch.tensor([0, 5])
    for seed, batch_seed in ((7, 0), (-3, 123456789), (1 << 62, 5)):
        moved = torch.tensor([seeded_key(int(k), seed, batch_seed) for k in keys])
        assert torch.equal(keyed_uniform(batch_seed, moved, positions), keyed_uniform(seed, keys, positions))
    assert seeded_key(11, 4, 4) == 11


def _reference(model_dir: Path, prompt: str, row_id: str, n: int, **sampling) -> list[int]:
    """The row decoded alone, in process, with the given settings as the job's."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    runner = ModelRunner(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64))
    params = GenerationParams(n, SamplingParams(**sampling), frozenset(), ignore_eos=True)
    request = RowRequest(tokenizer(prompt)["input_ids"], row_key(row_id))
    return AutoregressiveStrategy(runner).generate([request], params).rows[0].tokens


def test_job_with_per_row_settings(tmp_path, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = ["def f(x):", "import os", "class A:", "x = 1", "for i in y:", "return", "while True:", "if a:", "y"]
    ids = [derived_row_id("a.parquet", i) for i in range(len(prompts))]
    greedy_text = tokenizer.decode(_reference(tiny_model_dir, prompts[2], ids[2], 6))
    stop = greedy_text[3:5]
    columns = {
        "prompt": prompts,
        "n": [3, None, None, None, None, 0, None, None, None],
        "t": [None, 0.9, None, 0.9, None, None, -1.0, None, 0.9],
        "p": [None, None, None, None, None, None, None, 1.5, 0.8],
        "s": [None, None, [stop], None, None, None, None, None, None],
        "seed": [None, 7, None, None, None, None, None, None, None],
    }
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(columns), tmp_path / "in" / "a.parquet")
    params = "input.params_columns={max_new_tokens: n, temperature: t, top_p: p, stop: s, seed: seed}"
    extra = ["model.dtype=float64", "generation.max_new_tokens=6", "generation.ignore_eos=true", params]
    assert run_job(job_config(tmp_path, tiny_model_dir, *extra)).status == "succeeded"
    out = tmp_path / "out"
    rows = {r["row_id"]: r for r in pq.read_table(out / part_name(unit_id(0, 0))).to_pylist()}

    assert rows[ids[0]]["num_generated_tokens"] == 3
    assert rows[ids[0]]["completion"] == tokenizer.decode(_reference(tiny_model_dir, prompts[0], "x", 3))
    # Its own temperature and seed: the tokens of a job run with temperature 0.9 and seed 7, though
    # it shared its batch with row 3, which draws with the job's seed.
    sampled = _reference(tiny_model_dir, prompts[1], ids[1], 6, temperature=0.9, seed=7)
    assert rows[ids[1]]["completion"] == tokenizer.decode(sampled)
    assert sampled != _reference(tiny_model_dir, prompts[1], ids[1], 6, temperature=0.9, seed=0)
    job_seed = _reference(tiny_model_dir, prompts[3], ids[3], 6, temperature=0.9, seed=0)
    assert rows[ids[3]]["completion"] == tokenizer.decode(job_seed)
    top_p = _reference(tiny_model_dir, prompts[8], ids[8], 6, temperature=0.9, top_p=0.8)
    assert rows[ids[8]]["completion"] == tokenizer.decode(top_p)
    stopped = rows[ids[2]]
    assert stopped["finish_reason"] == "stop" and stopped["completion"] == greedy_text[: greedy_text.find(stop)]
    assert rows[ids[4]]["completion"] == tokenizer.decode(_reference(tiny_model_dir, prompts[4], "x", 6))
    for row_id, column, value in (
        (ids[5], "n", 0),
        (ids[6], "t", -1.0),
        (ids[7], "p", 1.5),
    ):
        error = rows[row_id]["error"]
        assert rows[row_id]["finish_reason"] == "error" and error.startswith(f"row {row_id}: input column '{column}'")
        assert f"is {value!r}: use " in error
    # Seeds and stop strings do not split batches (rows 1 and 3; rows 2 and 4); max_new_tokens,
    # temperature and top-p do (rows 0 and 8 alone).
    logs = [json.loads(line) for f in (out / "_logs").rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(r["batch_size"] for r in logs) == [1, 1, 2, 2]


def test_unknown_settings_and_missing_columns_fail_the_job(tmp_path, tiny_model_dir):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["x"], "k": [3]}), tmp_path / "in" / "a.parquet")
    with pytest.raises(JobError, match=r"\['top_k'\] cannot be set per row"):
        run_job(job_config(tmp_path, tiny_model_dir, "input.params_columns={top_k: k}"))
    with pytest.raises(JobError, match=r"input.params_columns.seed: column 'nope' is not in"):
        run_job(job_config(tmp_path, tiny_model_dir, "input.params_columns={seed: nope}"))

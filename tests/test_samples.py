"""n samples per row: each its own key, so a sample depends neither on n nor on its batch; the
samples of a prompt share its prefill; the commit protocol, resume and `accelgen verify` count n
output rows per input row, with an actor crash and an interruption on the way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from job_config import job_config
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM

from pipeline.commit import commit_record_name
from pipeline.driver import run_job
from pipeline.errors import JobError
from pipeline.verify import _sample_problems, verify
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams, row_key
from workers.common.contract import derived_row_id, part_name, unit_id
from workers.common.faults import FAULTS_ENV

PROMPTS = [f"def f{i}(x):" + " y" * (i % 3) for i in range(8)]
N = 3


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    yield
    ray.shutdown()


def test_sample_keys_are_distinct_and_sample_zero_is_the_rows_key():
    row_id = derived_row_id("a.parquet", 3)
    legacy = int.from_bytes(hashlib.blake2b(row_id.encode(), digest_size=8).digest(), "little", signed=True)
    assert row_key(row_id) == row_key(row_id, 0) == legacy
    keys = {row_key(r, s) for r in ("a", "b") for s in range(50)}
    assert len(keys) == 100


@pytest.mark.parametrize("name", ["autoregressive", "medusa"])
def test_samples_of_one_prompt_prefill_once_and_equal_their_lone_decoding(tiny_model_dir, name):
    target = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    models = registry.Models(target, heads=tiny_heads(target, tiny_model_dir))
    strategy = registry.create(StrategyOptions(name=name), models)
    params = GenerationParams(10, SamplingParams(temperature=0.9, seed=4), frozenset(), ignore_eos=True)
    prompts = [[5, 6, 7], [5, 6, 7], [9], [5, 6, 7], [9]]
    requests = [RowRequest(list(p), key=row_key("r", i)) for i, p in enumerate(prompts)]
    prefilled = []
    original = target.prefill
    target.prefill = lambda kv, batch, **kw: prefilled.append(len(batch)) or original(kv, batch, **kw)
    try:
        rows = strategy.generate(requests, params).rows
    finally:
        del target.prefill
    assert prefilled == [2]  # two distinct prompts for five rows
    alone = AutoregressiveStrategy(target)
    for request, row in zip(requests, rows, strict=True):
        assert row.tokens == alone.generate([request], params).rows[0].tokens  # the target's keyed samples
    assert len({tuple(r.tokens) for r, p in zip(rows, prompts, strict=True) if p == [5, 6, 7]}) == 3


def test_sample_problems_on_literal_rows():
    def rows(ids, samples):
        return pa.table({"row_id": ids, "sample_index": pa.array(samples, pa.int64())})

    assert _sample_problems(rows(["a", "a", "b", "b"], [0, 1, 1, 0]), 2) == []
    assert "do not have generation.n=2" in _sample_problems(rows(["a", "a", "b"], [0, 1, 0]), 2)[0]
    assert "pairs appear more than once" in _sample_problems(rows(["a", "a"], [1, 1]), 2)[-1]
    assert "outside 0..1" in _sample_problems(rows(["a", "a"], [0, 2]), 2)[0]
    assert "more than once" in _sample_problems(rows(["a", "a"], [0, 1]), 1)[0]


def _write_input(folder: Path) -> None:
    folder.mkdir()
    temperature = [None] * len(PROMPTS)
    temperature[5] = 0.0  # sampled n times at temperature 0: an error row, n times
    for shard in range(2):
        rows = slice(4 * shard, 4 * shard + 4)
        table = pa.table({"prompt": PROMPTS[rows], "t": pa.array(temperature[rows], pa.float64())})
        pq.write_table(table, folder / f"s{shard}.parquet", row_group_size=2)


def _run(tmp_path: Path, model: Path, out: str, *extra: str):
    config = job_config(
        tmp_path,
        model,
        f"output.url={tmp_path / out}",
        "model.dtype=float64",
        "input.rows_per_unit=2",
        "input.params_columns={temperature: t}",
        "generation.max_new_tokens=6",
        "generation.temperature=0.8",
        "generation.seed=11",
        *extra,
    )
    return run_job(config)


def _parts(out: Path) -> dict[str, str]:
    return {p["part"]: p["sha256"] for p in json.loads((out / "_manifest.json").read_text())["parts"]}


def _samples(out: Path) -> dict[tuple[str, int], dict]:
    table = pa.concat_tables([pq.read_table(out / part) for part in _parts(out)])
    return {(r["row_id"], r["sample_index"]): r for r in table.to_pylist()}


def test_n_samples_survive_a_crash_and_an_interruption(tmp_path, tiny_model_dir, monkeypatch):
    _write_input(tmp_path / "in")
    assert _run(tmp_path, tiny_model_dir, "ref", f"generation.n={N}", "workers.batch_size=4").status == "succeeded"
    reference = _parts(tmp_path / "ref")
    rows = _samples(tmp_path / "ref")
    assert len(rows) == N * len(PROMPTS)
    for i in range(len(PROMPTS)):
        row_id = derived_row_id(f"s{i // 4}.parquet", i % 4)
        texts = [rows[(row_id, s)]["completion"] for s in range(N)]
        if i == 5:
            assert all("generation.n=3 samples at temperature 0" in rows[(row_id, s)]["error"] for s in range(N))
        else:
            assert len(set(texts)) > 1, row_id  # samples differ
    report = verify(str(tmp_path / "ref"), str(tmp_path / "in"), {})
    assert report.ok and report.rows == N * len(PROMPTS), report.problems

    # An actor crash in the middle of a unit, other batch sizes, then an interruption: the same parts.
    out = tmp_path / "out"
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"exit_at_row": {"unit": unit_id(0, 1), "row": 1, "attempts": [1]}}))
    assert _run(tmp_path, tiny_model_dir, "out", f"generation.n={N}", "workers.batch_size=2").status == "succeeded"
    monkeypatch.delenv(FAULTS_ENV)
    assert _parts(out) == reference
    for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(1, 0)), commit_record_name(unit_id(1, 0))):
        (out / name).unlink()
    outcome = _run(tmp_path, tiny_model_dir, "out", f"generation.n={N}", "workers.batch_size=5")
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2 * N
    assert outcome.summary["rows_committed"] == outcome.summary["rows"] == N * len(PROMPTS)
    assert _parts(out) == reference
    assert verify(str(out), str(tmp_path / "in"), {}).ok

    # A sample does not depend on n: n=2 draws samples 0 and 1 of n=3.
    assert _run(tmp_path, tiny_model_dir, "two", "generation.n=2").status == "succeeded"
    two = _samples(tmp_path / "two")
    assert two.keys() == {key for key in rows if key[1] < 2}
    for key, row in two.items():
        if key[0] == derived_row_id("s1.parquet", 1):  # the temperature-0 row: an error row, whose message names n
            assert row["finish_reason"] == rows[key]["finish_reason"] == "error"
        else:
            assert row == rows[key], key

    # verify holds the output to the manifest's n.
    manifest = json.loads((tmp_path / "two" / "_manifest.json").read_text())
    manifest["config"]["generation"]["n"] = N
    (tmp_path / "two" / "_manifest.json").write_text(json.dumps(manifest))
    assert any("do not have generation.n=3" in p for p in verify(str(tmp_path / "two"), None, {}).problems)


def test_n_samples_at_temperature_zero_are_refused(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    with pytest.raises(JobError, match=r"generation\.n=4 samples at generation\.temperature=0"):
        _run(tmp_path, tiny_model_dir, "out", "generation.n=4", "generation.temperature=0")
    assert not (tmp_path / "out").exists()

"""The Ray Data step: read_parquet -> GenerateBatches -> write_parquet on the embedded cluster, giving the rows
`accelgen generate` gives for the same input and settings."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.data

from jobs.cli import main as cli
from jobs.ray_data import GenerateBatches, ray_data_config
from pipeline.errors import JobError

PROMPTS = ["def add(a, b):", "import os\n", "x", None, "for i in range(10):", "", "class Stack:", "return"]
SETTINGS = [
    "model.dtype=float64",
    "model.heads=null",
    "model.exits=null",
    "model.cmlm=null",
    "model.eagle=null",
    "strategy.name=speculative",
    "input.id_column=id",
    "input.keep_columns=[n]",
    "generation.max_new_tokens=8",
    "workers.batch_size=3",
]
COMPARED = ["row_id", "completion", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens", "n"]


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def test_the_ray_data_step_gives_the_cli_jobs_rows(tmp_path: Path, tiny_model_dir: Path, tiny_draft_dir: Path):
    (tmp_path / "in").mkdir()
    for shard in range(2):
        rows = range(shard * 4, shard * 4 + 4)
        table = pa.table({"id": [f"r{i}" for i in rows], "prompt": [PROMPTS[i] for i in rows], "n": list(rows)})
        pq.write_table(table, tmp_path / "in" / f"shard-{shard}.parquet")
    models = [f"model.target={tiny_model_dir}", f"model.draft={tiny_draft_dir}"]

    ds = ray.data.read_parquet(str(tmp_path / "in"))
    out = ds.map_batches(
        GenerateBatches,
        fn_constructor_kwargs={"overrides": [*SETTINGS, *models]},
        compute=ray.data.ActorPoolStrategy(size=1),
        batch_format="pyarrow",
        batch_size=3,
        num_cpus=1,
    )
    out.write_parquet(str(tmp_path / "ray-data"))
    from_ray_data = pq.read_table(tmp_path / "ray-data").sort_by("row_id")

    job = [f"input.url={tmp_path / 'in'}", f"output.url={tmp_path / 'job'}", *SETTINGS, *models]
    assert cli(["generate", *job]) == 0
    manifest = json.loads((tmp_path / "job" / "_manifest.json").read_text())
    from_job = pa.concat_tables([pq.read_table(tmp_path / "job" / p["part"]) for p in manifest["parts"]])
    from_job = from_job.sort_by("row_id")

    assert from_ray_data.column_names == from_job.column_names
    assert from_ray_data.select(COMPARED).to_pylist() == from_job.select(COMPARED).to_pylist()
    assert from_ray_data.num_rows == len(PROMPTS)
    errors = dict(
        zip(from_ray_data.column("row_id").to_pylist(), from_ray_data.column("error").to_pylist(), strict=True)
    )
    assert errors["r3"] == "prompt is null" and errors["r5"] == "prompt is empty or whitespace only"
    assert sum(n or 0 for n in from_ray_data.column("num_generated_tokens").to_pylist()) > 0
    assert set(from_ray_data.column("strategy").to_pylist()) - {None} <= {"speculative", "autoregressive"}


def test_the_ray_data_step_needs_an_id_column(tiny_model_dir: Path):
    with pytest.raises(JobError, match=r"input\.id_column is required on the Ray Data path"):
        ray_data_config(None, [f"model.target={tiny_model_dir}"])
    with pytest.raises(JobError, match=r"generation\.temperature must be >= 0"):
        ray_data_config(None, [f"model.target={tiny_model_dir}", "input.id_column=id", "generation.temperature=-1"])


def test_a_batch_missing_a_configured_column_is_refused_by_name(tiny_model_dir: Path):
    step = GenerateBatches(
        overrides=[
            f"model.target={tiny_model_dir}",
            "model.heads=null",
            "model.exits=null",
            "model.cmlm=null",
            "model.eagle=null",
            "input.id_column=id",
            "input.params_columns.temperature=temp",
        ]
    )
    with pytest.raises(JobError, match=r"columns \['temp'\] are not in the Dataset \(its columns: id, prompt\)"):
        step(pa.table({"id": ["a"], "prompt": ["x"]}))

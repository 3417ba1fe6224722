"""A job joins an existing multi-node cluster (`ray.address`) and gets the project's code through Ray."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from ray.cluster_utils import Cluster

from jobs.cli import default_job_config
from pipeline.config import load_config
from pipeline.driver import run_job


@pytest.fixture
def two_node_cluster():
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=2, resources={"decoder": 2})
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_job_on_a_two_node_cluster(tmp_path, tiny_model_dir, two_node_cluster):
    (tmp_path / "in").mkdir()
    prompts = [f"def f{i}(x):" for i in range(8)]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet", row_group_size=2)
    config = load_config(
        default_job_config(),
        None,
        [
            f"input.url={tmp_path / 'in'}",
            f"output.url={tmp_path / 'out'}",
            f"model.target={tiny_model_dir}",
            "input.rows_per_unit=2",
            "generation.max_new_tokens=4",
            f"ray.address={two_node_cluster.address}",
            "workers.num_actors=2",
            "workers.custom_resources={decoder: 1}",  # both actors on the worker node
        ],
    )
    assert run_job(config).status == "succeeded"
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["total_rows"] == 8 and len(manifest["parts"]) == 4

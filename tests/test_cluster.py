"""A job joins an existing multi-node cluster (`ray.address`) and gets the project's code through Ray."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from job_config import job_config
from ray.cluster_utils import Cluster

from pipeline.driver import run_job
from pipeline.verify import verify
from workers.common.faults import FAULTS_ENV


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
    config = job_config(
        tmp_path,
        tiny_model_dir,
        "input.rows_per_unit=2",
        "generation.max_new_tokens=4",
        f"ray.address={two_node_cluster.address}",
        "workers.num_actors=2",
        "workers.custom_resources={decoder: 1}",  # both actors on the worker node
    )
    assert run_job(config).status == "succeeded"
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["total_rows"] == 8 and len(manifest["parts"]) == 4


@pytest.fixture
def three_node_cluster():
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=1, resources={"decoder": 2}) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


def test_a_node_removed_mid_job(tmp_path, tiny_model_dir, three_node_cluster, monkeypatch, capsys):
    cluster, workers = three_node_cluster
    (tmp_path / "in").mkdir()
    prompts = [f"def f{i}(x):" for i in range(16)]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet", row_group_size=2)
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"batch_sleep_s": 1.0}))
    config = job_config(
        tmp_path,
        tiny_model_dir,
        "input.rows_per_unit=2",
        "workers.batch_size=2",  # a unit's rows at a time: the job is mid-way when the node goes
        "generation.max_new_tokens=4",
        f"ray.address={cluster.address}",
        "workers.num_actors=2",
        "workers.num_cpus_per_actor=0.5",
        "workers.custom_resources={decoder: 1}",
    )
    outcome: dict = {}
    job = threading.Thread(target=lambda: outcome.update(result=run_job(config)))
    job.start()
    deadline = time.monotonic() + 120
    while not (tmp_path / "out" / "_commits").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.remove_node(workers[0])  # its actor dies mid-unit; Ray restarts it on the other node
    job.join(timeout=300)
    assert outcome["result"].status == "succeeded"
    assert verify(str(tmp_path / "out"), str(tmp_path / "in"), {}).ok
    # The unit whose actor died was retried, and its second attempt is the one committed.
    attempts = [json.loads(p.read_text())["attempt"] for p in (tmp_path / "out" / "_commits").iterdir()]
    assert len(attempts) == 8 and max(attempts) == 2
    assert "attempt 1 failed" in capsys.readouterr().err

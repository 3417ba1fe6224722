"""Jobs on S3: a real endpoint on loopback (moto server) reached over HTTP through s3fs."""

from __future__ import annotations

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from s3_server import CREDENTIALS, FaultyProxy, MotoS3

from jobs.cli import main as cli
from jobs.shipped import default_job_config
from pipeline.config import load_config
from pipeline.driver import run_job
from pipeline.verify import verify
from workers.common.contract import part_name, unit_id

PROMPTS = [f"def f{i}(x):\n    return" + " x" * (i % 5) for i in range(12)]


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    server.start()
    yield server
    server.stop()
    ray.shutdown()


def _options(endpoint: str) -> dict:
    return {
        **CREDENTIALS,
        "client_kwargs": {"endpoint_url": endpoint},
        "config_kwargs": {"retries": {"max_attempts": 8}},
    }


def _upload_input(endpoint: str, bucket: str) -> None:
    fs = fsspec.filesystem("s3", **_options(endpoint))
    fs.mkdir(bucket)
    for n in range(3):
        table = pa.table({"prompt": PROMPTS[n * 4 : n * 4 + 4]})
        with fs.open(f"{bucket}/in/shard-{n}.parquet", "wb") as f:
            pq.write_table(table, f, row_group_size=2)


def _config(endpoint: str, bucket: str, model, out: str = "out"):
    overrides = [
        f"input.url=s3://{bucket}/in",
        f"output.url=s3://{bucket}/{out}",
        f"model.target={model}",
        "input.rows_per_unit=2",
        "generation.max_new_tokens=6",
    ]
    config = load_config(default_job_config(), None, overrides)
    config.input.storage_options = _options(endpoint)
    config.output.storage_options = _options(endpoint)
    return config


def test_job_reads_and_writes_s3_and_keeps_credentials_out(s3, tiny_model_dir, capsys):
    _upload_input(s3.endpoint, "jobs")
    assert run_job(_config(s3.endpoint, "jobs", tiny_model_dir)).status == "succeeded"
    options = _options(s3.endpoint)
    report = verify("s3://jobs/out", "s3://jobs/in", options)
    assert report.ok, report.problems
    assert report.rows == len(PROMPTS) and report.parts == 6
    fs = fsspec.filesystem("s3", **options)
    fs.invalidate_cache()
    names = fs.find("jobs/out")
    assert not [n for n in names if "/_staging/" in n]
    written = b"".join(fs.cat_file(n) for n in names)
    printed = capsys.readouterr()
    for secret in CREDENTIALS.values():
        assert secret.encode() not in written and secret not in printed.out + printed.err
    manifest = json.loads(fs.cat_file("jobs/out/_manifest.json"))
    assert manifest["config"]["input"]["storage_options"]["secret"] == "<redacted>"
    # The CLI checker agrees, and finds a stray part.
    opts = json.dumps(options)
    assert cli(["verify", "s3://jobs/out", "--input", "s3://jobs/in", "--storage-options", opts]) == 0
    stray, first = part_name(unit_id(99999, 0)), part_name(unit_id(0, 0))
    fs.pipe_file(f"jobs/out/{stray}", fs.cat_file(f"jobs/out/{first}"))
    assert cli(["verify", "s3://jobs/out", "--storage-options", opts]) == 1
    assert "not in the manifest" in capsys.readouterr().out


def test_transient_s3_errors_are_survived(s3, tiny_model_dir):
    _upload_input(s3.endpoint, "flaky")
    proxy = FaultyProxy(s3.port, every=7)
    proxy.start()
    try:
        assert run_job(_config(proxy.endpoint, "flaky", tiny_model_dir)).status == "succeeded"
    finally:
        proxy.stop()
    assert proxy.injected > 5
    report = verify("s3://flaky/out", "s3://flaky/in", _options(s3.endpoint))
    assert report.ok, report.problems


def test_output_inside_the_input_folder_on_s3(s3, tiny_model_dir):
    _upload_input(s3.endpoint, "nested")
    options = _options(s3.endpoint)
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file("nested/in/_SUCCESS", b"")
    fs.pipe_file("nested/in/.keep", b"")
    config = _config(s3.endpoint, "nested", tiny_model_dir, out="in/out")
    assert run_job(config).status == "succeeded"
    assert run_job(config).status == "already_complete"
    for _ in range(2):  # interrupted after the first commits, then resumed: twice over
        fs.rm([f"nested/in/out/{name}" for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(1, 0)))])
        outcome = run_job(config)
        assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2
    assert run_job(config).status == "already_complete"
    report = verify("s3://nested/in/out", "s3://nested/in", options)
    assert report.ok and report.rows == len(PROMPTS), report.problems


def test_model_read_from_s3_with_model_storage_options(s3, tiny_model_dir, tmp_path, capsys):
    """`accelgen generate` loads model.target from the bucket with model.storage_options alone (input and
    output stay local), and decodes exactly what the same model from its local folder decodes."""
    options = _options(s3.endpoint)
    fs = fsspec.filesystem("s3", **options)
    fs.mkdir("models")
    fs.put(str(tiny_model_dir), "models/tiny", recursive=True)
    pq.write_table(pa.table({"prompt": PROMPTS[:4]}), tmp_path / "prompts.parquet")
    base = [
        f"input.url={tmp_path / 'prompts.parquet'}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
        "model.eagle=null",
        "model.dtype=float64",
        "generation.max_new_tokens=6",
    ]
    local = [*base, f"output.url={tmp_path / 'local'}", f"model.target={tiny_model_dir}"]
    remote = [
        *base,
        f"output.url={tmp_path / 'remote'}",
        "model.target=s3://models/tiny",
        f"model.cache_dir={tmp_path / 'cache'}",
        f"model.storage_options.key={CREDENTIALS['key']}",
        f"model.storage_options.secret={CREDENTIALS['secret']}",
        f"model.storage_options.client_kwargs.endpoint_url={s3.endpoint}",
    ]
    assert cli(["generate", *local]) == 0
    assert cli(["generate", *remote]) == 0
    printed = capsys.readouterr()
    assert CREDENTIALS["secret"] not in printed.out + printed.err
    completions = {}
    for name in ("local", "remote"):
        manifest = json.loads((tmp_path / name / "_manifest.json").read_text())
        parts = [pq.read_table(tmp_path / name / p["part"]) for p in manifest["parts"]]
        completions[name] = pa.concat_tables(parts).sort_by("row_id").column("completion").to_pylist()
    assert completions["remote"] == completions["local"] and any(completions["local"])
    assert manifest["config"]["model"]["storage_options"]["secret"] == "<redacted>"
    assert CREDENTIALS["secret"] not in (tmp_path / "remote" / "_manifest.json").read_text()
    # The model came from the bucket: its files are in the download cache.
    assert [p.name for p in (tmp_path / "cache").glob("*/model.safetensors")] == ["model.safetensors"]

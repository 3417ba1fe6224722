"""The controller statistics file: round trip, bad files ignored with a warning, keys, merging, and
which entry an actor warm-starts from."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pyarrow as pa
import pytest
from job_config import job_config

from pipeline.driver import worker_spec
from strategies.control.controller import Learned, bucket
from strategies.control.cost_model import FORWARD_SAMPLES
from workers.common import controller_stats
from workers.common.controller_stats import SCHEMA, StatsKey
from workers.common.spec import WorkUnit
from workers.generator import Generator
from workers.warm_up import TIMED_WIDTHS

KEY = StatsKey("a" * 64, "cpu (2 threads)", "float32")


def _learned(rows: int, depth: int = 5, plain_s: float = 0.01) -> Learned:
    return Learned(
        row_time={("autoregressive", 8): ([plain_s, plain_s], 2), ("prompt_lookup", 8): ([0.012], rows // 8)},
        tau={"prompt_lookup": (2.5, rows / 16)},
        measured={"autoregressive": (2, 16), "prompt_lookup": (rows // 8, rows)},
        depth={"prompt_lookup": depth},
        nodes={"prompt_lookup": depth},
        forward_time={(8, 1): ([plain_s], 2), (8, 5): ([0.011], rows // 8)},
        host_time={("prompt_lookup", 8, 5): ([0.1], rows // 8)},
        tau_at={("prompt_lookup", 8, 5): (2.5, rows / 16), ("prompt_lookup", 1, 5): (3.0 + depth, 1.0)},
        tree_tau={("prompt_lookup", 5): (2.5, rows / 16)},
    )


def test_statistics_round_trip_through_the_file(tmp_path):
    url = str(tmp_path / "stats.json")
    other = dataclasses.replace(KEY, dtype="bfloat16")
    controller_stats.write(url, {}, {KEY: _learned(32), other: _learned(8, depth=2)})
    assert json.loads((tmp_path / "stats.json").read_text())["schema"] == SCHEMA
    assert controller_stats.read(url, {}) == {KEY: _learned(32), other: _learned(8, depth=2)}


@pytest.mark.parametrize(
    "schema", ["accelgen.controller_stats/1", "accelgen.controller_stats/2", "accelgen.controller_stats/3"]
)
def test_a_file_of_an_earlier_schema_is_read_without_its_times(tmp_path, schema):
    """Schema /1 had no forward or host times, /2 kept them and drafters' step times in seconds where /3
    keeps ratios to a plain step: their plain step times, τ and sizes still warm-start a job, and the
    rest is measured afresh. /3 kept every time but one τ per drafter: read whole, without τ by bucket
    and budget."""
    document = controller_stats.encode({KEY: _learned(32)})
    for entry in document["entries"]:
        del entry["tau_at"], entry["tree_tau"]
        if schema.endswith("/1"):
            del entry["forward_time"], entry["host_time"]
        else:
            assert entry["forward_time"] and entry["host_time"]
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({**document, "schema": schema}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = controller_stats.read(str(path), {})
    learned = dataclasses.replace(_learned(32), tau_at={}, tree_tau={})
    if schema.endswith("/3"):
        assert stats == {KEY: learned}
        return
    plain = {key: times for key, times in learned.row_time.items() if key[0] == "autoregressive"}
    assert stats == {KEY: dataclasses.replace(learned, row_time=plain, forward_time={}, host_time={})}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"schema": "accelgen.controller_stats/0", "entries": []}), "schema 'accelgen.controller_stats/0'"),
        (json.dumps([1, 2]), "schema 'list'"),
        (json.dumps({"schema": SCHEMA, "entries": [{"target": "x", "device": "cpu"}]}), "entry 0 is malformed"),
        (
            json.dumps(
                {
                    "schema": SCHEMA,
                    "entries": [
                        {**controller_stats.encode({KEY: _learned(8)})["entries"][0], "depth": {"prompt_lookup": -3}}
                    ],
                }
            ),
            "entry 0 is malformed",
        ),
    ],
    ids=["not-json", "old-schema", "not-a-document", "missing-fields", "negative-depth"],
)
def test_a_corrupt_or_old_file_is_ignored_with_a_warning_naming_it(tmp_path, content, reason):
    path = tmp_path / "stats.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match=rf"controller statistics {path} ignored: .*{reason}"):
        assert controller_stats.read(str(path), {}) == {}


def test_no_file_yet_is_no_statistics_and_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert controller_stats.read(str(tmp_path / "none.json"), {}) == {}


def test_actors_merge_by_what_each_measured_most():
    few, many = _learned(16, depth=3, plain_s=0.02), _learned(64, depth=7)
    merged = controller_stats.merge([few, many])
    assert merged.depth == {"prompt_lookup": 7} and merged.tau == {"prompt_lookup": (2.5, 4.0)}
    assert merged.row_time[("prompt_lookup", 8)] == ([0.012], 8)
    assert merged.row_time[("autoregressive", 8)] == ([0.02, 0.02], 2)  # equal counts: the first
    assert merged.forward_time == {(8, 1): ([0.02], 2), (8, 5): ([0.011], 8)}
    assert merged.host_time == {("prompt_lookup", 8, 5): ([0.1], 8)}
    assert merged.tau_at == many.tau_at and merged.tree_tau == many.tree_tau  # τ by size with its drafter's rows


def test_a_job_saves_to_its_logs_and_into_the_shared_file_keeping_other_keys(tmp_path):
    shared, output = str(tmp_path / "cache" / "stats.json"), str(tmp_path / "out")
    other = dataclasses.replace(KEY, target="b" * 64)
    controller_stats.write(shared, {}, {other: _learned(8), KEY: _learned(8, depth=1)})
    controller_stats.save_job(shared, output, {}, {KEY: [_learned(16, depth=3), _learned(32, depth=6)]})
    assert controller_stats.read(shared, {}) == {other: _learned(8), KEY: controller_stats.merge([_learned(32, 6)])}
    assert controller_stats.read(controller_stats.logs_url(output), {}) == {KEY: _learned(32, depth=6)}
    # The next job reads the shared file; without one, a resumed job reads its output's own.
    assert controller_stats.for_job(shared, output, {})[other] == _learned(8)
    assert controller_stats.for_job(None, output, {}) == {KEY: _learned(32, depth=6)}


def test_an_actor_warm_starts_only_from_its_own_target_device_and_dtype(tmp_path, tiny_model_dir):
    spec = worker_spec(job_config(tmp_path, tiny_model_dir, "strategy.name=prompt_lookup"), "job")
    spec = dataclasses.replace(spec, target_sha256=KEY.target)
    own = Generator(spec).stats_key
    assert own.target == KEY.target and own.dtype == "float32" and own.device.startswith("cpu (")
    strangers = {
        dataclasses.replace(own, target="b" * 64): _learned(32),
        dataclasses.replace(own, device="cuda (NVIDIA H200)"): _learned(32),
        dataclasses.replace(own, dtype="bfloat16"): _learned(32),
    }
    cold = Generator(dataclasses.replace(spec, controller_stats=strangers))
    assert cold.controller.measured == {} and cold.controller.row_time == {}
    warm = Generator(dataclasses.replace(spec, controller_stats={**strangers, own: _learned(32, depth=7)}))
    assert warm.controller.measured == _learned(32).measured and warm.controller.depth == {"prompt_lookup": 7}
    assert warm.controller_statistics() == (own, warm.controller.learned())


def test_an_actors_controller_knows_what_forwards_cost_at_its_batch_size_before_its_first_batch(
    tmp_path, tiny_model_dir
):
    config = job_config(tmp_path, tiny_model_dir, "model.draft=null", "strategy.name=auto", "workers.batch_size=3")
    spec = worker_spec(config, "job")
    forward = Generator(spec).controller.forward
    assert forward.widths(bucket(3)) == list(TIMED_WIDTHS)
    assert 0 < forward.row_seconds(bucket(3), 1) <= forward.row_seconds(bucket(3), 16)
    assert forward.widths(bucket(1)) == []  # only the batch size the job decodes at


def test_a_warm_started_actors_controller_adds_the_forwards_it_timed_to_those_it_loaded(tmp_path, tiny_model_dir):
    """The forwards an actor times at its start are this job's own: they go on top of an earlier job's
    times at the same keys, which loading them after would have replaced."""
    config = job_config(tmp_path, tiny_model_dir, "model.draft=null", "strategy.name=auto", "workers.batch_size=8")
    spec = worker_spec(config, "job")
    own = Generator(spec).stats_key
    warm = Generator(dataclasses.replace(spec, controller_stats={own: _learned(32, plain_s=123.0)}))
    plain = warm.controller.forward.times[(bucket(8), 1)]
    assert plain.count == 2 + FORWARD_SAMPLES and plain.recent[0] == 123.0 and len(plain.recent) == 1 + FORWARD_SAMPLES
    assert all(0 < t < 123.0 for t in list(plain.recent)[1:])


def test_a_warm_started_auto_actor_writes_what_a_cold_one_does(tmp_path, tiny_model_dir):
    """The statistics decide which lossless option decodes, never a token (float64, greedy)."""
    config = job_config(
        tmp_path,
        tiny_model_dir,
        "model.draft=null",
        "model.dtype=float64",
        "strategy.name=auto",
        "generation.max_new_tokens=16",
        "workers.batch_size=2",
    )
    spec = dataclasses.replace(worker_spec(config, "job"), target_sha256=KEY.target)
    prompts = ["a = b = a = b = a =", "def f(x):\n    return f(x)\ndef f(", "x", "1, 2, 3, 1, 2, 3, 1,"]
    table = pa.table({"prompt": prompts})
    unit = WorkUnit("u", "unused", "a.parquet", (0,), 0, len(prompts))

    def decode(generator: Generator) -> tuple[list[str], int, int]:
        """Completions, target forwards, and steps the controller has measured in all."""
        columns, records, _ = generator.decode_table(table, unit, attempt=1, error_rows={})
        steps = sum(s for s, _ in generator.controller.measured.values())
        return columns["completion"], sum(r["target_forwards"] for r in records), steps

    cold = Generator(spec)
    cold_completions, cold_forwards, cold_steps = decode(cold)
    assert cold_steps == cold_forwards  # one measured step per target forward
    key, learned = cold.controller_statistics()
    warm = Generator(dataclasses.replace(spec, controller_stats={key: learned}))
    warm_completions, warm_forwards, warm_steps = decode(warm)
    assert warm_steps == cold_steps + warm_forwards  # it started from what the cold one learned
    assert warm_completions == cold_completions

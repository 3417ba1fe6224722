"""The controller statistics file: round trip, bad files ignored with a warning, keys, merging, and
which entry an actor warm-starts from."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
from job_config import job_config

from pipeline.driver import worker_spec
from workers import controller_stats
from workers.controller import Learned
from workers.controller_stats import SCHEMA, StatsKey
from workers.generator import Generator

KEY = StatsKey("a" * 64, "cpu (2 threads)", "float32")


def _learned(rows: int, depth: int = 5, plain_s: float = 0.01) -> Learned:
    return Learned(
        row_time={("autoregressive", 8): ([plain_s, plain_s], 2), ("prompt_lookup", 8): ([0.012], rows // 8)},
        tau={"prompt_lookup": (2.5, rows / 16)},
        measured={"autoregressive": (2, 16), "prompt_lookup": (rows // 8, rows)},
        depth={"prompt_lookup": depth},
        nodes={"prompt_lookup": depth},
    )


def test_statistics_round_trip_through_the_file(tmp_path):
    url = str(tmp_path / "stats.json")
    other = dataclasses.replace(KEY, dtype="bfloat16")
    controller_stats.write(url, {}, {KEY: _learned(32), other: _learned(8, depth=2)})
    assert json.loads((tmp_path / "stats.json").read_text())["schema"] == SCHEMA
    assert controller_stats.read(url, {}) == {KEY: _learned(32), other: _learned(8, depth=2)}


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

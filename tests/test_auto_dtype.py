"""`model.dtype=auto` on CPU: bfloat16 where the CPU has bfloat16 matrix hardware and a decode step
measured faster in it, chosen once per job, recorded in its identity and reused on resume.

No bfloat16 step is timed here: the choice is tested on literal inputs, and the job's path with the
measurement replaced."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from job_config import job_config

from pipeline import driver
from pipeline.actor_pool import JobInterrupted
from pipeline.job_record import job_record, recorded_auto_dtype
from pipeline.shards import list_shards
from workers.common.dtype_choice import bf16_matrix_flags, choose_auto_dtype
from workers.generator import Generator
from workers.model_loading import resolve_dtype

FASTER_BF16 = {"float32": 0.060, "bfloat16": 0.040}
SLOWER_BF16 = {"float32": 0.040, "bfloat16": 0.060}
# What the in-process pool's first actor reports: a CPU with AVX512-BF16 whose bfloat16 step is faster.
MEASURED = {"dtype_seconds": FASTER_BF16, "bf16_flags": ["avx512_bf16"]}


@pytest.mark.parametrize(
    ("on_gpu", "flags", "seconds", "expected"),
    [
        (True, [], None, "bfloat16"),  # a GPU: bfloat16, measured or not
        (True, ["avx512_bf16"], SLOWER_BF16, "bfloat16"),
        (False, [], None, "float32"),  # no bfloat16 matrix hardware
        (False, [], FASTER_BF16, "float32"),  # hardware first: a step timed without it does not count
        (False, ["avx512_bf16"], None, "float32"),  # not measured
        (False, ["avx512_bf16"], FASTER_BF16, "bfloat16"),
        (False, ["amx_bf16", "avx512_bf16"], FASTER_BF16, "bfloat16"),
        (False, ["amx_bf16"], SLOWER_BF16, "float32"),  # the hardware, but this model's step is not faster
        (False, ["avx512_bf16"], {"float32": 0.05, "bfloat16": 0.05}, "float32"),  # a tie keeps float32
        (False, ["avx512_bf16"], {"float32": 0.0073, "bfloat16": 0.0070}, "float32"),  # within timing noise
    ],
)
def test_auto_chooses_from_the_device_the_cpu_flags_and_the_measured_steps(on_gpu, flags, seconds, expected):
    assert choose_auto_dtype(on_gpu, flags, seconds) == expected


def test_the_bfloat16_matrix_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n\nprocessor\t: 1\n")
    assert bf16_matrix_flags(str(cpuinfo)) == ["amx_bf16", "avx512_bf16"]
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert bf16_matrix_flags(str(cpuinfo)) == []
    assert bf16_matrix_flags(str(tmp_path / "absent")) == []


def test_auto_resolves_to_the_jobs_choice_on_cpu_and_to_bfloat16_on_gpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu) == torch.float32  # before a choice is made
    assert resolve_dtype("auto", cpu, "bfloat16") == torch.bfloat16
    assert resolve_dtype("auto", gpu, "float32") == torch.bfloat16
    assert resolve_dtype("float64", cpu, "bfloat16") == torch.float64  # a dtype named is the dtype


@pytest.mark.parametrize(("choice", "faster"), [("bfloat16", FASTER_BF16), ("float32", SLOWER_BF16)])
def test_the_first_actor_measures_each_dtype_and_decodes_in_the_jobs_choice(
    tmp_path, tiny_model_dir, monkeypatch, choice, faster
):
    """Asked to measure, an actor times a step in float32 and bfloat16 (here: the timing replaced by
    `faster`) and reports it with its CPU's flags; named the job's choice, it decodes in it: bfloat16
    through the load it measured, float32 through its own models. Each dtype is readied for a plain
    step alone until the choice, and only the one chosen then for every row count, once."""
    import workers.generator

    monkeypatch.setattr("workers.generator.bf16_matrix_flags", lambda: ["avx512_bf16"])
    threads = set()  # where the models were readied and timed: the engine's thread (`workers.engine`)

    def timed(runner, _):
        threads.add(threading.current_thread().name)
        return faster[str(runner.dtype)[6:]]

    monkeypatch.setattr("workers.generator.decode_step_seconds", timed)
    readied = []
    prepare = workers.generator.prepare_target

    def spy(runner, spec, plain_steps_only=False):
        threads.add(threading.current_thread().name)
        readied.append((str(runner.dtype)[6:], plain_steps_only))
        prepare(runner, spec, plain_steps_only)

    monkeypatch.setattr("workers.generator.prepare_target", spy)
    spec = driver.worker_spec(job_config(tmp_path, tiny_model_dir, "model.dtype=auto"), "job")
    generator = Generator(spec)
    float32_runner = generator.runner
    info = generator.ready(None, None, measure_dtypes=True)
    assert info["dtype_seconds"] == faster and info["bf16_flags"] == ["avx512_bf16"]
    assert info["dtype"] == "float32"  # nothing changes before the driver chooses
    measured = generator._candidate.models.target
    assert (
        generator.ready("job", choose_auto_dtype(False, info["bf16_flags"], info["dtype_seconds"]))["dtype"] == choice
    )
    assert generator.runner is (measured if choice == "bfloat16" else float32_runner)
    assert generator.stats_key.dtype == choice
    assert generator.ready("job", choice)["dtype"] == choice and "dtype_seconds" not in generator.ready("job", choice)
    assert readied == [("float32", True), ("bfloat16", True), (choice, False)]
    assert threads == {"decode"}


def _input(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    prompts = ["def add(a, b):\n", "class Stack:\n", "import os\n"]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet", row_group_size=1)


def test_the_measured_choice_is_part_of_the_jobs_identity(tmp_path, tiny_model_dir):
    _input(tmp_path)
    config = job_config(tmp_path, tiny_model_dir)
    shards = list_shards(config.input.url, config.input.storage_options)
    measured, unmeasured = job_record(config, shards, "bfloat16"), job_record(config, shards)
    assert measured["identity"]["model"]["dtype_chosen"] == "bfloat16"
    assert "dtype_chosen" not in unmeasured["identity"]["model"]  # as before measured choices: same ids
    assert measured["fingerprint"] != unmeasured["fingerprint"]
    assert job_record(config, shards, "float32")["fingerprint"] not in (
        measured["fingerprint"],
        unmeasured["fingerprint"],
    )
    assert (recorded_auto_dtype(measured), recorded_auto_dtype(unmeasured), recorded_auto_dtype(None)) == (
        "bfloat16",
        "",
        None,
    )


class InProcessPool:
    """The actor pool's part in a job, with one in-process generator and the measurement replaced: its
    first actor reports `MEASURED`, without timing anything."""

    seen: ClassVar[list[dict]] = []  # per pool: what it started with and was asked
    interrupt = False

    def __init__(self, config, spec, phases):
        self.config, self.spec = config, spec
        self.auto_dtype = spec.auto_dtype
        self.measures_dtype = config.model.dtype == "auto" and not spec.auto_dtype
        self.generator = None
        self.seen.append({"spec_auto_dtype": spec.auto_dtype, "measured": False})

    def choose_dtype(self):
        self.seen[-1]["measured"] = True
        self.auto_dtype = choose_auto_dtype(False, MEASURED["bf16_flags"], MEASURED["dtype_seconds"])
        return self.auto_dtype

    def wait_ready(self, job_id, phases):
        self.generator = Generator(self.spec)
        self.generator.ready(job_id, self.auto_dtype or None)  # as every actor is named the job and its dtype
        self.seen[-1]["decoded_in"] = self.generator.dtype

    def run(self, units, output, total_rows, rows_before):
        if self.interrupt:
            raise JobInterrupted("stopped after the claim")
        results = []
        for unit in units:
            result = self.generator.run_unit(
                unit, 1, output.staged_url(unit.unit_id), output.batch_log_url(unit.unit_id, 1), {}
            )
            output.publish(result)
            results.append(result)
        return results, {}

    def controller_statistics(self):
        return {}

    def loaded_since_ready(self):
        return {}

    def shutdown(self):
        pass


def test_a_job_records_its_choice_and_a_resumed_job_decodes_in_it_without_measuring(
    tmp_path, tiny_model_dir, monkeypatch
):
    """A new job measures once and claims its folder with the choice in its identity; interrupted and
    run again, it finds the choice recorded, hands it to its actors, measures nothing, and its manifest
    holds the same identity."""
    _input(tmp_path)
    config = job_config(tmp_path, tiny_model_dir, "model.dtype=auto", "generation.max_new_tokens=3")
    InProcessPool.seen = []
    monkeypatch.setattr(driver, "ActorPool", InProcessPool)
    monkeypatch.setattr(InProcessPool, "interrupt", True)
    assert driver.run_job(config).status == "interrupted"
    monkeypatch.setattr(InProcessPool, "interrupt", False)
    assert driver.run_job(config).status == "succeeded"
    first, resumed = InProcessPool.seen
    assert first == {"spec_auto_dtype": "", "measured": True, "decoded_in": torch.bfloat16}
    assert resumed == {"spec_auto_dtype": "bfloat16", "measured": False, "decoded_in": torch.bfloat16}
    manifest = driver.OutputFolder(config.output.url, config.output.storage_options).read_json("_manifest.json")
    assert manifest["identity"]["model"]["dtype"] == "auto"
    assert manifest["identity"]["model"]["dtype_chosen"] == "bfloat16"

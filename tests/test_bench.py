"""`accelgen bench`: its speed-up is a median of per-round ratios, robust to the machine's drift, and
it runs end to end on a tiny model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from jobs.bench.bookkeeping import BookkeepingBench, _write_input, run_driver, run_verify
from jobs.bench.decoding import HF_GENERATE, Run, _runs_in_turns
from jobs.bench.planning import PlanningBench
from jobs.bench.rounds import paired, per_round
from jobs.bench.scale import bench_main
from jobs.cli import main as cli
from strategies.artifacts.configs import EagleConfig
from strategies.artifacts.eagle import EagleHead
from workers.common.contract import OUTPUT_SCHEMA
from workers.common.model_files import weights_sha256


def test_paired_speedup_follows_each_round_and_drops_an_outlier():
    # The machine slows down by half in rounds 3-4; the contender is 1.25x faster in every round.
    reference = [1.0, 1.0, 2.0, 2.0, 1.0]
    contender = [0.8, 0.8, 1.6, 1.6, 3.0]  # round 5: a pause hit the contender
    assert paired(reference, contender) == pytest.approx(1.25)
    # The table's range shows the outlier round the median dropped.
    assert per_round(reference, contender) == pytest.approx([1.25, 1.25, 1.25, 1.25, 1 / 3])


def test_contenders_take_turns_batch_by_batch_each_round_a_new_pass_of_each():
    """A machine whose speed drifts within a round weighs on every contender alike: kills whole passes in
    turn, an order that does not reverse after each batch, a pass shared by two rounds, and a pass's parts
    joined out of order or not summed."""
    calls: list[tuple[str, int, int]] = []  # (contender, its pass, the batch's first prompt)

    def starter(name: str):
        started = []

        def start():
            started.append(len(started))
            number = started[-1]

            def decode(batches: list) -> Run:
                (batch,) = batches
                calls.append((name, number, batch[0]))
                return Run(batch[0] + 1.0, [[batch[0]]], [{"batch": batch[0]}])

            return decode

        return start

    runs = _runs_in_turns({"a": starter("a"), "b": starter("b")}, [[10], [20], [30]], repeats=2)
    order = [(name, first) for name, _, first in calls]
    first_round = [("a", 10), ("b", 10), ("b", 20), ("a", 20), ("a", 30), ("b", 30)]
    second_round = [("b", 10), ("a", 10), ("a", 20), ("b", 20), ("b", 30), ("a", 30)]  # the order went on reversing
    assert order == [*first_round, *second_round]
    assert {(name, number) for name, number, _ in calls[:6]} == {("a", 0), ("b", 0)}
    assert {(name, number) for name, number, _ in calls[6:]} == {("a", 1), ("b", 1)}
    for name in "ab":
        assert [r.wall_s for r in runs[name]] == [63.0, 63.0]
        assert all(r.tokens == [[10], [20], [30]] and [s["batch"] for s in r.stats] == [10, 20, 30] for r in runs[name])


def test_bench_times_every_contender_on_a_tiny_model(tmp_path, tiny_model_dir, tiny_draft_dir, capsys):
    """`accelgen bench` end to end: in float64 every lossless contender yields generate's greedy rows."""
    prompts = ["def add(a, b):", "import os\nimport sys\n", "for i in range(10):"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    report = tmp_path / "report.json"
    args = [
        f"model={tiny_model_dir}",
        f"draft={tiny_draft_dir}",
        f"prompts={tmp_path / 'prompts.jsonl'}",
        "num_prompts=3",
        "dtype=float64",
        "strategies=[autoregressive,speculative,prompt_lookup]",
        "strategy.num_speculative_tokens=3",
        "strategy.prompt_lookup.max_speculative_tokens=3",  # prompt lookup's drafts, too, at most 3 long
        "batch_sizes=[1,2]",
        "max_new_tokens=12",
        "repeats=1",
        f"report={report}",
    ]
    assert cli(["bench", *args]) == 0
    rows = {(r["batch_size"], r["contender"]): r for r in json.loads(report.read_text())}
    contenders = [HF_GENERATE, "autoregressive", "speculative", "prompt_lookup"]
    assert list(rows) == [(b, c) for b in (1, 2) for c in contenders]
    for (batch_size, name), row in rows.items():
        assert row["rows_equal_to_generate"] == 1.0, (batch_size, name)
        # Three prompts (cycled to fill a batch) of 12 tokens each, over the median wall time.
        assert row["tokens_per_s"] * row["median_wall_s"] == pytest.approx(3 * 12, rel=0.01)
        if name in (HF_GENERATE, "autoregressive"):
            assert row["tau"] is None and row["acceptance_by_position"] == []
        else:
            assert 1.0 <= row["tau"] <= 4.0 and 1 <= len(row["acceptance_by_position"]) <= 3
    assert rows[(1, "autoregressive")]["x_autoregressive"] == 1.0 and rows[(2, HF_GENERATE)]["x_generate"] == 1.0
    assert rows[(1, "autoregressive")]["x_autoregressive_range"] == [1.0, 1.0]
    low, high = rows[(2, "speculative")]["x_autoregressive_range"]  # one round: its ratio is the median too
    assert low == high == rows[(2, "speculative")]["x_autoregressive"]
    assert rows[(1, HF_GENERATE)]["x_autoregressive_range"] is not None
    table = capsys.readouterr().out
    assert all(f"{b:>5}  {c:<28}" in table for b, c in rows)
    assert "AR range" in table and f"{low:.2f}-{high:.2f}" in table


def _one_prompt_bench(tmp_path, model_dir, prompt: str, *keys: str) -> tuple[list[str], Path]:
    """A bench of one prompt in float64 at batch 1, 8 tokens, one repeat, plus `keys`; and its report's path."""
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": prompt}) + "\n")
    report = tmp_path / "report.json"
    args = [f"model={model_dir}", f"prompts={tmp_path / 'prompts.jsonl'}", "num_prompts=1", "dtype=float64", *keys]
    return [*args, "batch_sizes=[1]", "max_new_tokens=8", "repeats=1", f"report={report}"], report


def test_bench_times_eagle_with_each_tree_in_one_run(tmp_path, tiny_model_dir, capsys):
    """`eagle_trees` makes one contender of each tree; every one is lossless in float64."""
    target = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sha = weights_sha256(tiny_model_dir)
    EagleHead(EagleConfig.of_target(target, target_weights_sha256=sha)).save(tmp_path / "eagle")
    args, report = _one_prompt_bench(
        tmp_path,
        tiny_model_dir,
        "def add(a, b):",
        f"eagle={tmp_path / 'eagle'}",
        "strategies=[autoregressive,eagle]",
        "eagle_trees=[chain,static,dynamic]",
    )
    assert cli(["bench", *args]) == 0
    rows = {r["contender"]: r for r in json.loads(report.read_text())}
    trees = ["eagle tree=chain", "eagle tree=static", "eagle tree=dynamic"]
    assert list(rows) == [HF_GENERATE, "autoregressive", *trees]
    assert all(rows[name]["rows_equal_to_generate"] == 1.0 and rows[name]["tau"] >= 1.0 for name in trees)
    table = capsys.readouterr().out
    assert all(name in table for name in trees)
    assert cli(["bench", *args[:-1], "eagle_trees=[bushy]"]) == 2
    assert "eagle_trees: unknown ['bushy']; use dynamic, static, chain" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("strategy", "sweep", "values", "extra"),
    [
        ("prompt_lookup", "lookup_sizings", ["sizing=acceptance", "sizing=fixed"], []),
        ("lookahead", "lookahead_nodes", ["nodes=1", "nodes=4"], []),
        ("auto", "adaptive_growths", ["growth=1.0", "growth=2.0"], ["strategy.candidates=[prompt_lookup,lookahead]"]),
    ],
)
def test_bench_times_a_swept_option_as_one_contender_per_value(
    tmp_path, tiny_model_dir, strategy, sweep, values, extra
):
    """A sweep key (prompt lookup's draft sizings, Lookahead's tree budgets, `auto`'s growth, an option
    directly under `strategy`) makes one contender of each value, each lossless in float64."""
    listed = ",".join(value.split("=")[1] for value in values)
    args, report = _one_prompt_bench(
        tmp_path,
        tiny_model_dir,
        "a b a b a b a b",
        f"strategies=[autoregressive,{strategy}]",
        f"{sweep}=[{listed}]",
        "transformers=[]",
        *extra,
    )
    assert cli(["bench", *args]) == 0
    rows = {r["contender"]: r for r in json.loads(report.read_text())}
    labels = [f"{strategy} {value}" for value in values]
    assert list(rows) == ["autoregressive", *labels]
    assert all(rows[label]["agreement"]["exact_match"] == 1.0 for label in labels)
    if strategy == "lookahead":
        assert rows["lookahead nodes=1"]["tau"] <= 2.0  # one node: at most one draft token a step


def test_bench_keeps_one_controller_per_contender_so_variants_of_a_strategy_learn_apart(tiny_model_dir, tmp_path):
    """Lookahead under its controller at two tree budgets (a sweep's contenders) learns apart."""
    import dataclasses

    from omegaconf import OmegaConf

    from jobs.bench.decoding import Bench
    from jobs.bench.settings import BenchConfig

    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "a b a b"}) + "\n")
    keys = [f"model={tiny_model_dir}", f"prompts={tmp_path / 'prompts.jsonl'}", "strategies=[lookahead]"]
    config = OmegaConf.merge(
        OmegaConf.structured(BenchConfig), OmegaConf.from_dotlist([*keys, "strategy.adaptive=true"])
    )
    bench = Bench(OmegaConf.to_object(config))
    wide = dataclasses.replace(bench.config.strategy, name="lookahead")
    narrow = dataclasses.replace(wide, lookahead=dataclasses.replace(wide.lookahead, decoding_length=4))
    first, again = bench.fresh(wide, 1), bench.fresh(wide, 1)
    assert first.controller is again.controller  # one contender's passes share what it learned
    assert bench.fresh(narrow, 1).controller is not first.controller
    assert bench.fresh(wide, 8).controller is not first.controller
    # `new_controllers=true` (and `bench job=true`): every pass starts as a cold job's actor does
    cold = Bench(dataclasses.replace(OmegaConf.to_object(config), new_controllers=True))
    first, again = cold.fresh(wide, 1), cold.fresh(wide, 1)
    assert first.controller is not again.controller
    assert again.controller.step == 0 and again.controller.forward.widths(1)  # told forward costs, as an actor's


def test_a_bench_controller_is_told_what_forwards_cost_at_its_batch_size_as_an_actors_is(tiny_model_dir, tmp_path):
    """The in-process bench times the code a job runs: its cold controller starts as an actor's does."""
    from jobs.bench.decoding import Bench
    from jobs.bench.settings import BenchConfig
    from pipeline.config import load_config
    from strategies.control.controller import bucket
    from workers.warm_up import TIMED_WIDTHS

    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "a b a b"}) + "\n")
    keys = [f"model={tiny_model_dir}", f"prompts={tmp_path / 'prompts.jsonl'}", "strategies=[auto]"]
    bench = Bench(load_config(BenchConfig(), None, [*keys, "strategy.candidates=[prompt_lookup]"]))
    options = dataclasses.replace(bench.config.strategy, name="auto")
    forward = bench.fresh(options, 3).controller.forward
    assert forward.widths(bucket(3)) == list(TIMED_WIDTHS)
    assert forward.widths(bucket(1)) == []  # only the batch size it decodes at
    told = forward.row_seconds(bucket(3), 16)
    assert bench.fresh(options, 3).controller.forward.row_seconds(bucket(3), 16) == told  # told once, not per pass


def test_bench_times_each_of_our_contenders_with_f_linear_too_when_asked(tmp_path, tiny_model_dir, monkeypatch):
    """`compare_f_linear`: each of ours again as '<name> F.linear', run with packed weights off and on
    again after it, its controller apart from the packed contender's."""
    from jobs.bench.decoding import Bench
    from strategies.runtime import linear

    packing_in_runs = []
    ours = Bench.ours

    def spied(self, strategy, batches):
        packing_in_runs.append((getattr(strategy, "controller", None) is not None, linear.packing()))
        return ours(self, strategy, batches)

    monkeypatch.setattr(Bench, "ours", spied)
    args, report = _one_prompt_bench(
        tmp_path,
        tiny_model_dir,
        "a b a b",
        "dtype=float32",
        "strategies=[prompt_lookup]",
        "strategy.adaptive=true",
        "compare_f_linear=true",
    )
    assert cli(["bench", *args, "transformers=[]"]) == 0
    rows = {r["contender"]: r for r in json.loads(report.read_text())}
    assert list(rows) == ["prompt_lookup", "prompt_lookup F.linear"]
    # Warm-up and one round of each (alternated), then the greedy reference (no controller), packed.
    assert packing_in_runs == [(True, True), (True, False), (True, True), (True, False), (False, True)]
    assert linear.packing() and all(r["agreement"]["exact_match"] == 1.0 for r in rows.values())


def test_bench_refuses_a_sweep_value_the_option_does_not_take(tmp_path, tiny_model_dir, capsys):
    args, _ = _one_prompt_bench(tmp_path, tiny_model_dir, "a b", "strategies=[prompt_lookup]", "lookup_sizings=[guess]")
    assert cli(["bench", *args]) == 2
    assert "lookup_sizings: unknown ['guess']; use acceptance, fixed" in capsys.readouterr().err


def test_job_input_splits_cycled_prompts_into_shards(tmp_path):
    import pyarrow.parquet as pq

    from jobs.bench.job import write_input

    folder = write_input(["a", "b", "c"], rows=7, shards=3, folder=tmp_path / "in")
    tables = [pq.read_table(p).to_pydict() for p in sorted(folder.glob("*.parquet"))]
    assert [len(t["id"]) for t in tables] == [2, 3, 2]
    assert [p for t in tables for p in t["prompt"]] == ["a", "b", "c", "a", "b", "c", "a"]
    assert len({i for t in tables for i in t["id"]}) == 7


def test_job_decoding_sums_every_batch_record(tmp_path):
    from jobs.bench.job import decoding_of

    for unit, records in (("u0", [(0.5, 10), (0.25, 6)]), ("u1", [(1.0, 20)])):
        folder = tmp_path / "_logs" / "batches" / unit
        folder.mkdir(parents=True)
        lines = [json.dumps({"wall_s": w, "generated_tokens": n}) for w, n in records]
        (folder / "attempt-1-x.jsonl").write_text("\n".join(lines) + "\n")
    assert decoding_of(tmp_path) == (pytest.approx(1.75), 36)


def test_job_rows_give_the_rounds_lowest_and_highest_decode_ratio(capsys):
    from jobs.bench.job_table import Timed, print_rows, summarize

    runs = {
        ("autoregressive", "cold"): [Timed(20.0, 10.0, 1000), Timed(20.0, 10.0, 1000), Timed(20.0, 10.0, 1000)],
        ("auto", "cold"): [Timed(16.0, 8.0, 1000), Timed(16.0, 5.0, 1000), Timed(16.0, 10.0, 1000)],
    }
    auto = next(r for r in summarize(1, runs) if r["contender"] == "auto")
    assert auto["x_autoregressive_decode"] == pytest.approx(1.25)  # the rounds read 1.25, 2.0 and 1.0
    assert auto["x_autoregressive_decode_range"] == pytest.approx([1.0, 2.0])
    print_rows([auto])
    assert "1.00-2.00" in capsys.readouterr().out


def test_job_rows_pair_rounds_with_autoregressive_of_the_same_mode_and_print_the_aims():
    from jobs.bench.job_table import Timed, aims, summarize
    from jobs.bench.vllm_peer import VLLM_PLAIN, vllm_row

    runs = {
        ("autoregressive", "cold"): [Timed(20.0, 10.0, 1000), Timed(40.0, 20.0, 1000)],  # round 2: machine slowed
        ("auto", "cold"): [Timed(16.0, 6.0, 1000), Timed(32.0, 12.0, 1000)],
        ("transformers.generate", "in-process"): [Timed(5.0, 5.0, 1000), Timed(10.0, 10.0, 1000)],
        ("auto", "in-process"): [Timed(3.0, 3.0, 1000), Timed(6.0, 6.0, 1000)],
    }
    rows = {(r["contender"], r["mode"]): r for r in summarize(8, runs)}
    auto = rows[("auto", "cold")]
    assert auto["x_autoregressive_wall"] == pytest.approx(1.25)  # 20/16 and 40/32 in each round
    assert auto["x_autoregressive_decode"] == pytest.approx(10 / 6, rel=1e-3)
    assert auto["x_autoregressive_decode_range"] == pytest.approx([10 / 6, 10 / 6], rel=1e-3)
    assert auto["outside_decoding_s"] == pytest.approx(15.0)  # median of 10 and 20
    assert auto["x_in_process"] == pytest.approx(0.5)  # the job decodes at half the in-process rate
    assert rows[("transformers.generate", "in-process")]["x_autoregressive_decode"] == pytest.approx(2.0)
    assert rows[("transformers.generate", "in-process")]["x_autoregressive_wall"] is None
    vllm = vllm_row(8, VLLM_PLAIN, {"load_s": 60.0, "generate_s": [2.0, 1.0, 4.0], "tokens": 1000})
    assert vllm["decode_tokens_per_s"] == 500.0 and vllm["engine_start_s"] == 60.0
    lines = aims([*rows.values(), vllm], num_prompts=8)
    assert lines[0].endswith("(aim >= 1): not met")  # 66.7 against vLLM's 500 tok/s
    assert lines[1].startswith("auto, cold job at batch 1: decodes -x") and lines[1].endswith("not measured")
    assert lines[2] == (
        "auto, cold job at batch 8: decodes 1.67x the autoregressive job's rate (whole job 1.25x) (aim >= 1.0): met"
    )
    assert lines[3].endswith("not measured")  # batch 32
    assert (
        lines[4]
        == "cold job decode over the same decoding in-process: at least 0.50x (auto at batch 8) (aim >= 0.9): not met"
    )
    assert lines[5].endswith("not measured")  # no transformers prompt lookup
    assert lines[6].endswith("at most 15.0 s (aim <= 10 s): not met")


def test_job_vllm_without_its_python_is_a_row_that_says_how_to_measure_it():
    from jobs.bench.vllm_peer import VLLM_NGRAM, vllm_row, vllm_runs

    class Config:
        vllm_python = ""

    row = vllm_row(24, VLLM_NGRAM, vllm_runs(Config(), ["x"], None, "ngram"))
    assert row["not_measured"].startswith("give vllm_python=")


def test_job_vllm_decodes_in_the_dtype_the_bench_decodes_in():
    from jobs.bench.vllm_peer import peer_command

    class Config:
        vllm_python, model, max_new_tokens, repeats = "/venv/bin/python", "/models/twin", 64, 2
        dtype = "bfloat16"

    assert "--dtype=bfloat16" in peer_command(Config(), Path("p.json"), Path("r.json"), "plain")
    Config.dtype = "auto"  # float32 on CPU, as our contenders load it
    assert "--dtype=float32" in peer_command(Config(), Path("p.json"), Path("r.json"), "ngram")


def test_device_check_counts_a_junit_report_and_names_each_failure():
    from jobs.device_check import junit_summary

    xml = """<testsuites><testsuite>
    <testcase classname="tests.test_a" name="test_ok"/>
    <testcase classname="tests.test_a" name="test_bad">
      <failure message="assert [1, 2] == [1, 3]&#10;more">x</failure>
    </testcase>
    <testcase classname="tests.test_b" name="test_err"><error message="CUDA error">y</error></testcase>
    <testcase classname="tests.test_b" name="test_skip"><skipped message="no"/></testcase>
    </testsuite></testsuites>"""
    summary = junit_summary(xml)
    assert (summary["passed"], summary["failed"], summary["skipped"]) == (1, 2, 1)
    assert summary["failures"] == [
        {"test": "tests.test_a::test_bad", "message": ["assert [1, 2] == [1, 3]"]},
        {"test": "tests.test_b::test_err", "message": ["CUDA error"]},
    ]


def test_device_check_profile_step_runs_on_cpu(tmp_path):
    """The profile step of `python -m jobs.device_check` (its own process: it wraps the decoding code's
    functions in profiler labels) runs through on CPU with `--dry-run`, for both strategies."""
    import subprocess
    import sys

    out = tmp_path / "profile.json"
    command = [sys.executable, "-m", "jobs.device_check", f"--profile-only={out}", "--dry-run"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["device"] == "cpu" and found["autoregressive"]["wall_s"] > 0
    assert {"plain_steps", "controller"} <= set(found["auto"]["parts"])


def test_job_warm_job_shares_the_new_cache_of_the_cold_job_before_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from jobs.bench import job as bench_job

    calls = []

    def fake_job(overrides, output, log):
        cache = Path(overrides[-1].split("=")[1])  # not there before the cold job: it makes it
        calls.append((overrides, output, cache.read_text() if cache.exists() else None))
        cache.write_text(output.name)  # what the job leaves in the cache
        return bench_job.Timed(2.0, 1.0, 10)

    monkeypatch.setattr(bench_job, "run_job", fake_job)
    config = SimpleNamespace(warm=True, warm_cache_key="workers.stats_url")
    for round_index in (0, 1):
        passes = bench_job._cold_then_warm(config, ["strategy.name=auto"], tmp_path, "auto", 8, round_index)
        assert [mode for mode, _ in passes] == ["cold", "warm"]
    caches = [overrides[-1] for overrides, _, _ in calls]
    assert caches[0] == caches[1] != caches[2] == caches[3]
    assert [seen for _, _, seen in calls] == [None, "out-auto-b8-r0-cold", None, "out-auto-b8-r1-cold"]
    assert len({output for _, output, _ in calls}) == 4


def test_bookkeeping_bench_commits_and_verifies_a_small_job_with_every_output_column(tmp_path):
    """The bench stages parts by hand against the output contract: every column strategies declare must
    be there (null), or writing the parts fails; `accelgen verify` then accepts the job."""
    bench = BookkeepingBench(rows=40, shards=2, rows_per_unit=10)
    _write_input(str(tmp_path / "in"), {}, bench)
    assert run_driver(str(tmp_path), {}, bench)["units"] == 4
    assert run_verify(str(tmp_path), {})["verdict"] == "OK"
    part = pq.read_table(next((tmp_path / "out").glob("part-*.parquet")))
    assert part.schema.equals(OUTPUT_SCHEMA) and part.column("iterations").null_count == 10


def test_a_scale_bench_prints_its_usage_names_a_wrong_key_and_runs_with_the_keys_given(capsys):
    ran: list[PlanningBench] = []

    def run(bench: PlanningBench) -> int:
        ran.append(bench)
        return 7

    assert bench_main("usage: planning", PlanningBench(), ["--help"], run) == 0
    assert capsys.readouterr().out == "usage: planning\n"
    assert bench_main("usage: planning", PlanningBench(), ["shards=many"], run) == 2
    error = capsys.readouterr().err
    assert error.startswith("error:") and "'shards'" in error
    assert bench_main("usage: planning", PlanningBench(), ["shards=3", "ids=false"], run) == 7
    assert len(ran) == 1 and (ran[0].shards, ran[0].ids, ran[0].rows_per_shard) == (3, False, 100)


def test_job_mode_times_in_process_the_jobs_rows_never_a_batch_filled_beyond_them(
    tmp_path, tiny_model_dir, monkeypatch
):
    from jobs.bench.decoding import Bench, Run
    from jobs.bench.job import in_process_contenders
    from jobs.bench.settings import BenchConfig

    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a = 1", "def f():")))
    config = BenchConfig(
        model=str(tiny_model_dir),
        prompts=str(tmp_path / "prompts.jsonl"),
        num_prompts=3,
        dtype="float64",
        transformers=[],
        max_new_tokens=4,
    )
    bench = Bench(config)
    assert [len(b) for b in bench.batches(4)] == [4]  # in-process alone: a batch size decodes full batches
    assert [len(b) for b in bench.batches(4, fill=False)] == [3] and [len(b) for b in bench.batches(2, False)] == [2, 1]
    # A job of 3 rows at batch size 4 decodes 3 rows of 4 tokens: so does its in-process contender, on the
    # torch threads a job's actor runs at that batch size, whatever ran in between.
    before, seen = torch.get_num_threads(), []
    try:
        by_batch = in_process_contenders(bench, lambda batch_size: batch_size // 2)
        four, two = by_batch(4)["autoregressive"], by_batch(2)["autoregressive"]
        assert four().tokens == 3 * 4
        monkeypatch.setattr(bench, "ours", lambda strategy, b: seen.append(torch.get_num_threads()) or Run(0.0, []))
        four()
        two()
    finally:
        torch.set_num_threads(before)
    assert seen == [2, 1]


def test_job_mode_hands_an_in_process_pass_s_freed_heap_back_before_the_next_job(monkeypatch):
    """A bench process keeping the heap its passes freed slowed the jobs it ran next: each pass trims it."""
    from jobs.bench import job

    trimmed = []

    class Libc:
        def malloc_trim(self, pad: int) -> int:
            trimmed.append(pad)
            return 1

    monkeypatch.setattr(job.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(job.sys, "platform", "linux")
    timed = job.Timed(2.0, 1.0, 10)
    assert job._released(timed) is timed and trimmed == [0]
    monkeypatch.setattr(job.sys, "platform", "darwin")
    job._released(timed)
    assert trimmed == [0]

"""End-to-end jobs on an embedded Ray with a tiny model: the output contract, bad rows, resume, refusals."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from job_config import job_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.shipped import default_job_config
from pipeline.cluster import init_ray
from pipeline.commit import commit_record_name
from pipeline.config import load_config
from pipeline.driver import _print_summary, _summary, run_job
from pipeline.errors import JobError
from pipeline.phases import Phases
from pipeline.verify import verify
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams, filtered_probs, row_key
from workers.common.contract import derived_row_id, part_name, unit_id
from workers.common.spec import UnitResult

GOOD = [
    "def add(a, b):",
    "import os\nimport sys\n",
    "x",
    "class Stack:\n    def push(self, item):\n        self.items.append(",
    "for i in range(10):",
    "return",
]
BAD = {"null": None, "empty": "", "blank": "  \n\t ", "too_long": "word " * 200}


@pytest.fixture(scope="module", autouse=True)
def embedded_ray():
    ray.shutdown()  # the first job starts its own Ray, so its summary has a Ray start to measure
    yield
    ray.shutdown()


def _write_input(folder: Path) -> dict[str, str | None]:
    """Three shards (one split into row groups); returns prompt by id."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(f"good-{i}", p) for i, p in enumerate(GOOD)] + [(f"bad-{k}", v) for k, v in BAD.items()]
    shards = [rows[0:4], rows[4:8], rows[8:]]
    for n, shard in enumerate(shards):
        table = pa.table({"id": [r[0] for r in shard], "prompt": [r[1] for r in shard], "n": [n] * len(shard)})
        pq.write_table(table, folder / f"shard-{n}.parquet", row_group_size=2)
    return dict(rows)


def _config(tmp_path: Path, model: Path, *extra: str):
    return job_config(
        tmp_path,
        model,
        "model.dtype=float64",
        "input.id_column=id",
        "input.keep_columns=[n]",
        "input.rows_per_unit=2",
        "generation.max_new_tokens=12",
        "generation.ignore_eos=true",
        "workers.batch_size=3",
        *extra,
    )


def _read_output(out: Path) -> pa.Table:
    manifest = json.loads((out / "_manifest.json").read_text())
    return pa.concat_tables([pq.read_table(out / p["part"]) for p in manifest["parts"]])


def _read_logs(out: Path) -> list[dict]:
    return [json.loads(line) for f in (out / "_logs").rglob("*.jsonl") for line in f.read_text().splitlines()]


def _part_hashes(out: Path) -> dict[str, str]:
    return {p["part"]: p["sha256"] for p in json.loads((out / "_manifest.json").read_text())["parts"]}


def test_job_output_contract_and_oracle(tmp_path, tiny_model_dir):
    prompts = _write_input(tmp_path / "in")
    # A draft the strategy does not use is never read: this one does not exist.
    began = time.perf_counter()
    outcome = run_job(_config(tmp_path, tiny_model_dir, f"model.draft={tmp_path / 'no-such-draft'}"))
    outside_s = time.perf_counter() - began
    assert outcome.status == "succeeded"
    summary = outcome.summary
    # The wall time (run_job's start to the manifest) in phases that add up to it, each measured.
    phases = summary["phases_s"]
    assert min(phases.values()) >= 0 and sum(phases.values()) == pytest.approx(summary["wall_s"], abs=0.01)
    # What run_job does after the manifest's clock stops (writing it, _SUCCESS) is a small part of it.
    assert 0 < outside_s - summary["wall_s"] < 0.1 * outside_s, (outside_s, summary["wall_s"])
    measured = ("planning", "ray_start", "actor_start", "load_target", "first_batch", "decoding", "commits", "shutdown")
    missing = [name for name in measured if name not in phases]
    assert not missing, f"phases not measured: {missing} (summary: {phases})"
    # Every phase but commits and shutdown (a few local renames, killing an actor: they may round to
    # 0 ms on a fast machine) takes real time here.
    at_zero = [name for name in measured if phases[name] <= 0 and name not in ("commits", "shutdown")]
    assert not at_zero, f"phases measured as 0 s: {at_zero} (summary: {phases})"
    assert "load_draft" not in phases
    assert phases["other"] < 0.2 * summary["wall_s"], phases
    out = tmp_path / "out"
    assert (out / "_SUCCESS").exists() and not (out / "_staging").exists()
    rows = {r["row_id"]: r for r in _read_output(out).to_pylist()}
    assert sorted(rows) == sorted(prompts)  # exactly one output row per input row
    for key in BAD:
        row = rows[f"bad-{key}"]
        assert row["finish_reason"] == "error" and row["error"] and row["completion"] is None
    assert "leaving no room to generate" in rows["bad-too_long"]["error"]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for i, prompt in enumerate(GOOD):
        row = rows[f"good-{i}"]
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert row["completion"] == tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
        assert row["finish_reason"] == "length" and row["num_generated_tokens"] == 12
        assert row["num_prompt_tokens"] == ids.shape[1] and row["strategy"] == "autoregressive"
        assert row["n"] == (0 if i < 4 else 1)

    logs = [
        json.loads(line) for f in (out / "_logs" / "batches").rglob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert sum(r["generated_tokens"] for r in logs) == 12 * len(GOOD)
    assert sum(r["rows_finished"] for r in logs) == len(GOOD)  # each record counts what it decoded, once
    assert {unit for r in logs for unit in r["units"]} <= {
        p.parent.name for p in (out / "_logs" / "batches").rglob("*.jsonl")
    }
    assert {
        "job_id",
        "units",
        "actor",
        "device",
        "strategy",
        "batch_size",
        "wall_s",
        "tokens_per_s",
    } <= set(logs[0])
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["summary"]["phases_s"] == phases
    assert manifest["versions"]["torch"] and manifest["identity"]["model"]["weights_sha256"]["target"]

    assert run_job(_config(tmp_path, tiny_model_dir)).status == "already_complete"
    with pytest.raises(JobError, match="different job"):
        run_job(_config(tmp_path, tiny_model_dir, "generation.max_new_tokens=5"))
    # Actor count and batch size are not part of the job's identity.
    assert run_job(_config(tmp_path, tiny_model_dir, "workers.batch_size=1")).status == "already_complete"


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    assert run_job(_config(tmp_path, tiny_model_dir)).status == "succeeded"
    out = tmp_path / "out"
    reference = _part_hashes(out)
    # An interruption: two units never committed, no manifest, no _SUCCESS.
    for unit in (unit_id(0, 0), unit_id(2, 0)):
        (out / part_name(unit)).unlink()
        (out / commit_record_name(unit)).unlink()
    (out / "_SUCCESS").unlink()
    (out / "_manifest.json").unlink()
    outcome = run_job(_config(tmp_path, tiny_model_dir, "workers.batch_size=2"))
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 4
    assert _part_hashes(out) == reference


def test_corrupt_shard_fails_its_unit_only_and_rerun_resumes(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    shard = tmp_path / "in" / "shard-2.parquet"  # one unit
    failed = unit_id(2, 0)
    good_bytes = shard.read_bytes()
    meta = pq.ParquetFile(shard).metadata
    corrupt = bytearray(good_bytes)
    start = meta.row_group(0).column(1).data_page_offset  # prompt column of the first row group
    corrupt[start : start + 40] = b"\xab" * 40
    shard.write_bytes(bytes(corrupt))
    outcome = run_job(_config(tmp_path, tiny_model_dir))
    out = tmp_path / "out"
    assert outcome.status == "failed" and not (out / "_SUCCESS").exists()
    assert list(outcome.summary["failed_units"]) == [failed]
    assert "shard-2.parquet" in outcome.summary["failed_units"][failed]
    assert (out / part_name(unit_id(0, 0))).exists()
    # Fixing the file changes its stamp; the job still resumes, since no unit of it was committed.
    shard.write_bytes(good_bytes)
    outcome = run_job(_config(tmp_path, tiny_model_dir))
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2
    # A shard that changes after its units were committed makes a different job.
    (tmp_path / "in" / "shard-0.parquet").touch()
    with pytest.raises(JobError, match="different job"):
        run_job(_config(tmp_path, tiny_model_dir))


def test_actors_that_cannot_be_scheduled_fail_the_job_quickly(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    with pytest.raises(JobError, match="reserves 64 CPUs"):
        run_job(_config(tmp_path, tiny_model_dir, "workers.num_actors=64"))
    config = _config(
        tmp_path, tiny_model_dir, "workers.custom_resources={no_such_node: 1}", "workers.actor_start_timeout_s=3"
    )
    with pytest.raises(JobError, match=r"not running after workers\.actor_start_timeout_s=3s"):
        run_job(config)


def test_a_local_clusters_actors_run_at_the_jobs_niceness_with_one_malloc_arena():
    """Ray would start them 15 nicer than the job, so that they decode slower whenever anything else runs;
    and an actor's decoding thread would take its memory fresh from the kernel, in an arena of its own."""
    init_ray("")
    niceness = ray.remote(lambda: os.nice(0))  # a lambda travels by value, not as this module's name
    assert ray.get(niceness.remote()) == os.nice(0)
    arenas = ray.remote(lambda: os.environ.get("MALLOC_ARENA_MAX"))
    assert ray.get(arenas.remote()) == os.environ.get("MALLOC_ARENA_MAX", "1")


def test_speculative_jobs_greedy_equal_and_sampling_runs(tmp_path, tiny_model_dir, tiny_draft_dir):
    _write_input(tmp_path / "in")
    assert run_job(_config(tmp_path, tiny_model_dir)).status == "succeeded"
    greedy = {r["row_id"]: r["completion"] for r in _read_output(tmp_path / "out").to_pylist()}
    spec = [
        f"model.draft={tiny_draft_dir}",
        "strategy.name=speculative",
        "strategy.num_speculative_tokens=3",
        "strategy.adaptive=false",  # every row decoded by speculation itself, whatever it gains
    ]
    config = _config(tmp_path, tiny_model_dir, *spec, f"output.url={tmp_path / 'spec'}")
    assert run_job(config).status == "succeeded"
    rows = _read_output(tmp_path / "spec").to_pylist()
    assert {r["row_id"]: r["completion"] for r in rows} == greedy
    assert {r["strategy"] for r in rows if r["finish_reason"] != "error"} == {"speculative"}
    metrics = {"draft_tokens", "accepted_tokens", "acceptance_by_position", "tau", "tau_by_drafter"}
    assert all(metrics <= set(r) for r in _read_logs(tmp_path / "spec"))
    with pytest.raises(JobError, match="needs a draft model"):
        run_job(
            _config(
                tmp_path,
                tiny_model_dir,
                "strategy.name=speculative",
                "model.draft=null",
                f"output.url={tmp_path / 'x'}",
            )
        )


def test_sampled_retrieval_drafters_emit_the_targets_own_keyed_samples(tmp_path, tiny_model_dir):
    """Prompt lookup and Lookahead verify by the target's own keyed draw: a sampled row is the row
    plain decoding samples, token for token, whichever drafter ran and whatever it drafted."""
    (tmp_path / "in").mkdir()
    prompts = [p * 3 for p in GOOD if len(p) < 30]  # repeated text: the retrieval drafters find drafts
    how = ["prompt_lookup", "lookahead", "prompt_lookup", "lookahead", "prompt_lookup"]
    ids = [f"r{i}" for i in range(len(prompts))]
    pq.write_table(pa.table({"id": ids, "prompt": prompts, "how": how}), tmp_path / "in" / "a.parquet")
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=7)
    config = _config(
        tmp_path,
        tiny_model_dir,
        "input.keep_columns=[]",
        "input.strategy_column=how",
        "model.draft=null",
        "strategy.adaptive=false",
        "strategy.prompt_lookup.sizing=fixed",  # drafts on every match: the tiny model's are seldom accepted
        f"generation.temperature={sampling.temperature}",
        f"generation.top_k={sampling.top_k}",
        f"generation.seed={sampling.seed}",
    )
    assert run_job(config).status == "succeeded"
    rows = {r["row_id"]: r for r in _read_output(tmp_path / "out").to_pylist()}
    assert [rows[i]["strategy"] for i in ids] == how
    assert sum(r["accepted_tokens"] for r in _read_logs(tmp_path / "out")) > 0  # drafts were accepted

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = AutoregressiveStrategy(
        ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    )
    requests = [RowRequest(tokenizer(p)["input_ids"], row_key(i)) for p, i in zip(prompts, ids, strict=True)]
    params = GenerationParams(12, sampling, frozenset(), ignore_eos=True)
    samples = [tokenizer.decode(r.tokens, skip_special_tokens=True) for r in plain.generate(requests, params).rows]
    assert [rows[i]["completion"] for i in ids] == samples


def test_sampled_speculative_job_keeps_the_targets_distribution(tmp_path, tiny_model_dir, tiny_draft_dir):
    """Speculative sampling with a draft model draws other samples than plain decoding, from the same
    distribution: 600 rows of one prompt, 3 tokens each among the target's top 3, against the
    target's exact probabilities of each completion (chi-square)."""
    (tmp_path / "in").mkdir()
    n, prompt = 600, "def add(a, b):"
    table = pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [prompt] * n})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    sampling = SamplingParams(temperature=1.0, top_k=3, seed=11)
    config = _config(
        tmp_path,
        tiny_model_dir,
        "input.keep_columns=[]",
        f"input.rows_per_unit={n}",
        "workers.batch_size=200",
        "generation.max_new_tokens=3",  # the prefill's token, then a verified draft token and the next
        f"model.draft={tiny_draft_dir}",
        "strategy.name=speculative",
        "strategy.adaptive=false",
        f"generation.temperature={sampling.temperature}",
        f"generation.top_k={sampling.top_k}",
        f"generation.seed={sampling.seed}",
    )
    outcome = run_job(config)
    assert outcome.status == "succeeded" and outcome.summary["drafter_faults"] == {}
    logs = _read_logs(tmp_path / "out")
    assert not any(r["faults"] for r in logs)  # no fault turned speculation off
    drafted, accepted = sum(r["draft_tokens"] for r in logs), sum(r["accepted_tokens"] for r in logs)
    assert drafted == n and 0 < accepted < n  # the draft is right only sometimes: both paths are taken

    expected = _completion_probabilities(tiny_model_dir, prompt, sampling, length=3)
    observed = Counter(r["completion"] for r in _read_output(tmp_path / "out").to_pylist())
    assert set(observed) <= set(expected)
    chi2, dof = _chi_square(observed, expected, n)
    assert chi2 < _chi2_critical(dof), (chi2, observed, expected)


def test_the_job_summary_warns_of_drafter_faults(capsys):
    """Faults of a drafter leave exact output but cost its speed-up: the summary counts them per
    drafter over the units, with the first message, and points at the batch records."""

    def unit(name: str, faults: dict[str, tuple[int, str]]) -> UnitResult:
        return UnitResult(name, 1, "", 1, 0, "", 0, 1, 1, 0.1, "a", "cuda:0", drafter_faults=faults)

    first = "verify with draft_model: RuntimeError: Expected all tensors to be on the same device"
    results = [unit("00000-00000", {"draft_model": (2, first)}), unit("00001-00000", {}), unit("00002-00000", {})]
    results[2].drafter_faults = {"draft_model": (3, "proposer draft_model: later")}
    summary = _summary(results, {}, Phases(), 3)
    assert summary["drafter_faults"] == {"draft_model": {"faults": 5, "first": first}}
    _print_summary(summary)
    warning = capsys.readouterr().err
    assert f"warning: drafter draft_model faulted 5 times (first: {first})" in warning
    assert "_logs/batches/" in warning
    _print_summary(_summary(results[1:2], {}, Phases(), 1))
    assert "warning" not in capsys.readouterr().err


def test_the_job_summary_adds_up_the_controllers_exploring(capsys):
    """Units of two actors: their records' controller seconds add up, and the summary gives the shares
    of the decoding under the controller that exploring took and that it lost (what its budget limits)."""

    def unit(name: str, exploring: dict[str, float]) -> UnitResult:
        return UnitResult(name, 1, "", 1, 0, "", 0, 1, 1, 0.1, "a", "cpu", exploring=exploring)

    results = [
        unit("00000-00000", {"exploring_s": 0.15, "exploring_lost_s": 0.1, "decoding_s": 2.5}),
        unit("00001-00000", {"exploring_s": 0.05, "exploring_lost_s": 0.0, "decoding_s": 1.5}),
    ]
    summary = _summary(results, {}, Phases(), 2)
    assert summary["controller_s"] == pytest.approx({"exploring_s": 0.2, "exploring_lost_s": 0.1, "decoding_s": 4.0})
    _print_summary(summary)
    assert (
        "controller: exploring steps 0.20s of its 4.00s of decoding (5.0%); those that lost to plain steps "
        "0.10s (2.5%; budget 3%)"
    ) in capsys.readouterr().out
    _print_summary(_summary([unit("00002-00000", {})], {}, Phases(), 1))  # no controller: no line
    assert "controller:" not in capsys.readouterr().out


def _completion_probabilities(model_dir: Path, prompt: str, sampling: SamplingParams, length: int) -> dict[str, float]:
    """The target's exact probability of each completion text of `length` tokens (texts of several
    token sequences add up), enumerating every sequence of tokens the sampling filter leaves."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    sequences = _sequence_probabilities(model, tokenizer(prompt)["input_ids"], sampling, length)
    texts: Counter[str] = Counter()
    for sequence, p in sequences.items():
        texts[tokenizer.decode(list(sequence), skip_special_tokens=True)] += p
    return dict(texts)


def _sequence_probabilities(
    model: torch.nn.Module, prompt: list[int], sampling: SamplingParams, length: int
) -> dict[tuple[int, ...], float]:
    """The target's exact probability of every token sequence of `length` the sampling filter leaves."""
    sequences = {(): 1.0}
    for _ in range(length):
        grown = {}
        with torch.inference_mode():
            logits = model(torch.tensor([[*prompt, *s] for s in sequences])).logits[:, -1]
        for (sequence, p), probs in zip(sequences.items(), filtered_probs(logits, sampling), strict=True):
            for token in probs.nonzero().flatten().tolist():
                grown[(*sequence, token)] = p * float(probs[token])
        sequences = grown
    return sequences


def _chi_square(observed: Counter, expected: dict, n: int) -> tuple[float, int]:
    """(chi-square, degrees of freedom) of counts over `n` trials; cells expected under 5 are pooled."""
    rare = [k for k, p in expected.items() if p * n < 5]
    cells = [([k], p) for k, p in expected.items() if p * n >= 5] + [(rare, sum(expected[k] for k in rare))]
    cells = [(keys, p) for keys, p in cells if p > 0]
    chi2 = sum((sum(observed[k] for k in keys) - p * n) ** 2 / (p * n) for keys, p in cells)
    return chi2, len(cells) - 1


def _chi2_critical(dof: int) -> float:
    """The chi-square value exceeded with probability 0.001 (Wilson-Hilferty, within 1% from 5 degrees of freedom)."""
    z = 3.0902  # the standard normal's 0.999 quantile
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def test_rows_pick_their_strategy_and_auto_equals_greedy(tmp_path, tiny_model_dir, tiny_draft_dir):
    (tmp_path / "in").mkdir()
    prompts = ["def f(x):", "import os", "class A:", "for i in range(3):", "x = 1", "return x"]
    chosen = ["lookahead", None, "prompt_lookup", "nonsense", "autoregressive", "speculative"]
    pq.write_table(pa.table({"prompt": prompts, "how": chosen}), tmp_path / "in" / "a.parquet")
    base = [
        f"input.url={tmp_path / 'in'}",
        f"model.target={tiny_model_dir}",
        f"model.draft={tiny_draft_dir}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
        "model.eagle=null",
        "model.dtype=float64",
        "generation.max_new_tokens=10",
    ]
    plain = load_config(default_job_config(), None, [*base, f"output.url={tmp_path / 'plain'}"])
    assert run_job(plain).status == "succeeded"
    greedy = {r["row_id"]: r["completion"] for r in _read_output(tmp_path / "plain").to_pylist()}

    picked = load_config(
        default_job_config(), None, [*base, f"output.url={tmp_path / 'picked'}", "input.strategy_column=how"]
    )
    assert run_job(picked).status == "succeeded"
    rows = {r["row_id"]: r for r in _read_output(tmp_path / "picked").to_pylist()}
    bad = rows[derived_row_id("a.parquet", 3)]
    assert bad["finish_reason"] == "error" and "unknown strategy 'nonsense'" in bad["error"]
    for row_id, row in rows.items():
        if row_id != derived_row_id("a.parquet", 3):
            assert row["completion"] == greedy[row_id]
    assert rows[derived_row_id("a.parquet", 4)]["strategy"] == "autoregressive"

    shared = tmp_path / "cache" / "stats.json"
    auto = load_config(
        default_job_config(),
        None,
        [*base, f"output.url={tmp_path / 'auto'}", "strategy.name=auto", f"workers.controller_stats_url={shared}"],
    )
    assert run_job(auto).status == "succeeded"
    rows = _read_output(tmp_path / "auto").to_pylist()
    assert {r["row_id"]: r["completion"] for r in rows} == greedy
    # What its controller learned, keyed by the target's hash, for the next job.
    target = json.loads((tmp_path / "auto" / "_manifest.json").read_text())["identity"]["model"]["weights_sha256"]
    stats = json.loads(shared.read_text())
    assert [(e["target"], e["dtype"]) for e in stats["entries"]] == [(target["target"], "float64")]
    assert stats == json.loads((tmp_path / "auto" / "_logs" / "controller_stats.json").read_text())
    # auto drafts only among the lossless drafters whose models the job has (no heads, no exits, no EAGLE
    # head), and its records account for every target forward. Whether it explores any in a job of 60
    # tokens is the controller's exploration budget's to say (a share of the decode time), not asserted.
    logs = _read_logs(tmp_path / "auto")
    steps = Counter()
    for record in logs:
        steps.update(record["steps_by_drafter"])
    candidates = {"speculative", "prompt_lookup", "lookahead", "jacobi"}
    assert set(steps) <= candidates | {"autoregressive"}
    assert sum(steps.values()) == sum(r["target_forwards"] for r in logs)
    assert {r["strategy"] for r in rows} <= candidates | {"autoregressive"}
    assert all({"from", "to", "reason"} <= set(e) for r in logs for e in r["switches"])
    # The summary's share of tokens by what emitted them covers every token of the job.
    by_drafter = json.loads((tmp_path / "auto" / "_manifest.json").read_text())["summary"][
        "generated_tokens_by_drafter"
    ]
    assert sum(by_drafter.values()) == sum(r["num_generated_tokens"] for r in rows)
    assert set(by_drafter) - {"autoregressive"} <= candidates
    # The controller's seconds: its records' added up, exploring within its steps, losing within exploring.
    controlled = json.loads((tmp_path / "auto" / "_manifest.json").read_text())["summary"]["controller_s"]
    for kind in ("decoding_s", "exploring_s", "exploring_lost_s"):
        assert controlled[kind] == pytest.approx(sum(r["exploring"][kind] for r in logs), abs=2e-3)
    assert 0 <= controlled["exploring_lost_s"] <= controlled["exploring_s"] <= controlled["decoding_s"]
    assert 0 < controlled["decoding_s"] <= sum(r["wall_s"] for r in logs)


@pytest.mark.slow  # two jobs; tests/test_controller_stats.py checks the same in-process
def test_a_warm_started_auto_job_writes_what_a_cold_one_does(tmp_path, tiny_model_dir):
    """The first job leaves its controller's statistics in its _logs/ and the shared file; the second
    starts from them (its counts continue the first's) and writes the same completions."""
    (tmp_path / "in").mkdir()
    prompts = ["a = b = a = b = a =", "def f(x):\n    return f(x)\ndef f(", "x", "1, 2, 3, 1, 2, 3, 1,"]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet")
    shared = tmp_path / "cache" / "stats.json"

    def job(name: str) -> tuple[dict[str, str], int, int]:
        """Completions by row, target forwards, and steps the controller statistics count in all."""
        config = job_config(
            tmp_path,
            tiny_model_dir,
            f"output.url={tmp_path / name}",
            "model.draft=null",
            "model.dtype=float64",
            "strategy.name=auto",
            "generation.max_new_tokens=16",
            "workers.batch_size=2",
            f"workers.controller_stats_url={shared}",
        )
        assert run_job(config).status == "succeeded"
        out = tmp_path / name
        stats = json.loads((out / "_logs" / "controller_stats.json").read_text())
        target = json.loads((out / "_manifest.json").read_text())["identity"]["model"]["weights_sha256"]["target"]
        assert [(e["target"], e["dtype"]) for e in stats["entries"]] == [(target, "float64")]
        assert json.loads(shared.read_text()) == stats
        steps = sum(m["steps"] for m in stats["entries"][0]["measured"].values())
        completions = {r["row_id"]: r["completion"] for r in _read_output(out).to_pylist()}
        return completions, sum(r["target_forwards"] for r in _read_logs(out)), steps

    cold, cold_forwards, cold_steps = job("cold")
    assert cold_steps == cold_forwards  # one measured step per target forward
    warm, warm_forwards, warm_steps = job("warm")
    assert warm_steps == cold_steps + warm_forwards  # the second job's controller started from the first's
    assert warm == cold


def test_output_inside_the_input_folder_across_reruns_and_resumes(tmp_path, tiny_model_dir):
    prompts = _write_input(tmp_path / "in")
    (tmp_path / "in" / ".DS_Store").write_bytes(b"not parquet")
    (tmp_path / "in" / "_SUCCESS").write_text("")
    out = tmp_path / "in" / "out"
    config = _config(tmp_path, tiny_model_dir, f"output.url={out}")
    assert run_job(config).status == "succeeded"
    reference = _part_hashes(out)
    assert run_job(config).status == "already_complete"
    for _ in range(2):  # an interruption after the first commits, resumed: twice over
        for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(1, 0))):
            (out / name).unlink()
        outcome = run_job(config)
        assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2
    assert _part_hashes(out) == reference
    assert run_job(config).status == "already_complete"
    report = verify(str(out), str(tmp_path / "in"), {})
    assert report.ok and report.rows == len(prompts), report.problems


def test_resume_over_a_changed_listing(tmp_path, tiny_model_dir):
    _write_input(tmp_path / "in")
    config = _config(tmp_path, tiny_model_dir)
    assert run_job(config).status == "succeeded"
    out = tmp_path / "out"
    for name in ("_SUCCESS", "_manifest.json", part_name(unit_id(2, 0))):
        (out / name).unlink()
    # Files that are not data (named _* or .*) may come and go: the listing does not change.
    extra = pa.table({"id": ["z"], "prompt": ["x"], "n": [9]})
    pq.write_table(extra, tmp_path / "in" / ".shard-9.parquet")
    (tmp_path / "in" / "_tmp").mkdir()
    pq.write_table(extra, tmp_path / "in" / "_tmp" / "shard-9.parquet")
    # A shard added (or removed) renumbers the units: a different job, and the refusal says why.
    pq.write_table(extra, tmp_path / "in" / "shard-3.parquet")
    with pytest.raises(JobError, match=r"1 input shards added \(shard-3\.parquet\)"):
        run_job(config)
    (tmp_path / "in" / "shard-3.parquet").unlink()
    (tmp_path / "in" / "shard-2.parquet").touch()  # changed, but none of its units is committed
    outcome = run_job(config)
    assert outcome.status == "succeeded" and outcome.summary["rows_this_run"] == 2


def test_manifest_lossy_lists_the_lossy_strategies_rows_picked(tmp_path, tiny_model_dir, tiny_draft_dir):
    """A plain job whose strategy column routes a row to specdec is lossy there, and the manifest says so."""
    (tmp_path / "in").mkdir()
    table = pa.table({"prompt": ["def f(x):", "import os", "class A:"], "how": ["specdec", None, "autoregressive"]})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    config = job_config(
        tmp_path,
        tiny_model_dir,
        "input.strategy_column=how",
        f"model.draft={tiny_draft_dir}",
        "generation.max_new_tokens=6",
        # specdec itself, not its controller, which may decode a 6-token row plainly (then nothing is lossy).
        "strategy.adaptive=false",
    )
    assert run_job(config).status == "succeeded"
    assert sorted(r["strategy"] for r in _read_output(tmp_path / "out").to_pylist()) == [
        "autoregressive",
        "autoregressive",
        "specdec",
    ]
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert list(manifest["lossy"]) == ["specdec"] and "strategy.specdec" in manifest["lossy"]["specdec"]

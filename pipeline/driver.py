"""The driver: check, plan, start the actor pool, feed it units, commit what comes back, summarise.

Everything that can fail a job fails before the first write (config, input, output ownership,
resources). Then the actor pool (`pipeline/actor_pool.py`) decodes the units not yet committed, and
the driver finishes the job (manifest, `_SUCCESS`) or says what is left to resume.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Any

from pipeline.actor_pool import ActorPool, JobInterrupted
from pipeline.auto_dtype import job_auto_dtype
from pipeline.checks import validate
from pipeline.commit import JOB_FILE, OutputFolder
from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.input_formats import check_text_input, plan_input_units, resolve_format, scan_text_shards
from pipeline.job_record import job_record, model_hash, optional_models, recorded_auto_dtype
from pipeline.lossy import lossy_strategies, strategies_of_parts, unreproducible_sampling
from pipeline.phases import Phases
from pipeline.shards import Listing, Shard, check_columns, check_ids, list_data_files, read_shards
from strategies.control.controller import ControllerSettings
from workers.common import controller_stats
from workers.common.model_files import has_chat_template
from workers.common.output_formats import part_suffix
from workers.common.spec import UnitResult, WorkerSpec, WorkUnit, add_up, tally_faults


@dataclass
class JobOutcome:
    status: str  # "succeeded" | "already_complete" | "failed" | "interrupted"
    summary: dict[str, Any]


def run_job(config: JobConfig, phases: Phases | None = None) -> JobOutcome:
    """Check, plan and claim the output folder, decode the units not yet committed, then finish the
    job (manifest, `_SUCCESS`) or say what is left to resume.

    The actors start first and load their models while the driver plans the input (a finished output
    folder, which can run no unit, starts none); a job that fails its checks stops them again.
    `phases`: the job's clock, when its caller started it earlier (`accelgen generate` starts Ray
    before it calls this), so that the summary's phases add up to the whole job."""
    phases = phases or Phases()
    validate(config)
    output = OutputFolder(config.output.url, config.output.storage_options, part_suffix(config.output.format))
    recorded = recorded_auto_dtype(output.read_json(JOB_FILE)) if config.model.dtype == "auto" else ""
    pool = None if output.finished() else ActorPool(config, _actor_spec(config, output, recorded), phases)
    try:
        return _plan_and_run(config, output, pool, phases, recorded)
    finally:
        if pool is not None:
            pool.shutdown()


def _actor_spec(config: JobConfig, output: OutputFolder, recorded_dtype: str | None) -> WorkerSpec:
    """What the actors start with before the input is planned: the job's id comes later
    (`ActorPool.wait_ready`); the target's weights hash (cached, as the fingerprint will want it again),
    the statistics the controllers warm-start from and a resumed job's dtype for `model.dtype=auto`
    (`recorded_dtype`, `job_record.recorded_auto_dtype`: float32 on CPU where it recorded none) do not
    depend on the input."""
    stats = controller_stats.for_job(
        config.workers.controller_stats_url, output.url, dict(config.output.storage_options)
    )
    target_sha256 = model_hash(config, config.model.target, "model.target")
    spec = dataclasses.replace(worker_spec(config, job_id=""), target_sha256=target_sha256, controller_stats=stats)
    if recorded_dtype is None:
        return spec
    if recorded_dtype:
        print(f"model.dtype=auto: {recorded_dtype} on CPU, as the job recorded")
    return dataclasses.replace(spec, auto_dtype=recorded_dtype or "float32")


def _plan_and_run(
    config: JobConfig, output: OutputFolder, pool: ActorPool | None, phases: Phases, recorded_dtype: str | None
) -> JobOutcome:
    shards = _checked_shards(config)
    units = plan_input_units(shards, config.input.rows_per_unit)
    record = job_record(config, shards, job_auto_dtype(pool, phases, recorded_dtype))
    job_id = record["fingerprint"]
    total_rows = sum(u.num_rows for u in units) * config.generation.n  # output rows
    if output.claim(job_id, record):
        print(f"job {job_id[:12]} already complete in {config.output.url}: nothing to do")
        return JobOutcome("already_complete", {"rows": total_rows})
    committed = output.committed()
    todo = [u for u in units if u.unit_id not in committed]
    if committed:
        print(f"resuming job {job_id[:12]}: {len(units) - len(todo)} of {len(units)} units already committed")
    phases.lap("planning")
    results: list[UnitResult] = []
    failures: dict[str, str] = {}
    if todo and pool is not None:
        try:
            results, failures = _run_units(pool, job_id, todo, output, total_rows, committed, phases)
        except JobInterrupted as exc:
            print(f"job {job_id[:12]} interrupted: {exc}; run the same command again to resume", file=sys.stderr)
            return JobOutcome("interrupted", {"rows": total_rows})
    committed = output.committed()
    phases.lap("other")
    summary = _summary(results, committed, phases, total_rows)
    if failures or len(committed) != len(units):
        return _incomplete(job_id, summary, failures, len(units) - len(committed), len(units))
    parts = [committed[u.unit_id] for u in units]
    used = strategies_of_parts(parts)
    output.finish(
        {
            **record,
            "lossy": lossy_strategies(config.strategy, used),
            "unreproducible_sampling": unreproducible_sampling(config.strategy, used),
            "parts": parts,
            "total_rows": sum(p["rows"] for p in parts),
            "summary": summary,
        }
    )
    _print_summary(summary)
    return JobOutcome("succeeded", summary)


def _run_units(
    pool: ActorPool,
    job_id: str,
    todo: list[WorkUnit],
    output: OutputFolder,
    total_rows: int,
    committed: dict[str, dict[str, Any]],
    phases: Phases,
) -> tuple[list[UnitResult], dict[str, str]]:
    """Decode and commit `todo` once the pool's actors are ready, then shut them down (results, failed
    units); the actors' controllers leave what they learned for later jobs. The phases get what the
    job waited of actor start and model loading (`ActorPool.wait_ready`), then the run: first batch,
    optional models loaded on first use, commits, and the rest as decoding."""
    pool.wait_ready(job_id, phases)
    try:
        run_began = time.time()
        results, failures = pool.run(todo, output, total_rows, sum(c["rows"] for c in committed.values()))
        phases.lap("decoding")
        shared, options = pool.config.workers.controller_stats_url, dict(pool.config.output.storage_options)
        controller_stats.save_job(shared, output.url, options, pool.controller_statistics())
        phases.lap("other")
        first_batch_end = min((r.first_record_end for r in results if r.first_record_end is not None), default=None)
        if first_batch_end is not None:
            phases.take("decoding", "first_batch", first_batch_end - run_began)
        for model, seconds in pool.loaded_since_ready().items():
            phases.take("first_batch", f"load_{model}", seconds)
        phases.take("decoding", "commits", output.publish_s)
        return results, failures
    finally:
        pool.shutdown()
        phases.lap("shutdown")


def _incomplete(job_id: str, summary: dict[str, Any], failures: dict[str, str], missing: int, units: int) -> JobOutcome:
    for unit, message in sorted(failures.items()):
        print(f"unit {unit} failed: {message}", file=sys.stderr)
    summary["failed_units"] = failures
    _print_summary(summary)
    print(
        f"job {job_id[:12]} incomplete: {missing} of {units} units not committed; "
        "fix the cause and run the same command again to resume",
        file=sys.stderr,
    )
    return JobOutcome("failed", summary)


def _checked_shards(config: JobConfig) -> list[Shard]:
    """The input's shards, its own output folder left out, after every check that needs only the input.

    Prints how long that took: on object storage, with thousands of shards, it is the driver's
    longest step before the first unit starts.
    """
    started = time.perf_counter()
    listing = list_data_files(config.input.url, config.input.storage_options, exclude=config.output.url)
    input_format = resolve_format(config.input.format, listing, config.input.url)
    if input_format != "parquet":
        return _checked_text_shards(config, listing, input_format, started)
    shards = read_shards(listing)
    check_columns(
        shards,
        config.input.prompt_column,
        config.input.id_column,
        list(config.input.keep_columns),
        config.input.strategy_column,
        dict(config.input.params_columns),
        config.input.messages_column,
    )
    if config.input.messages_column:
        _check_chat_template(config)
    if config.input.id_column:
        check_ids(shards, config.input.id_column, config.input.storage_options)
    print(
        f"planning: {len(shards)} shards, {sum(s.num_rows for s in shards)} rows listed, footers read and "
        f"checked in {time.perf_counter() - started:.1f}s"
    )
    return shards


def _checked_text_shards(config: JobConfig, listing: Listing, input_format: str, started: float) -> list[Shard]:
    """The JSON Lines files of the input, scanned and checked (`pipeline/input_formats.py`)."""
    shards = scan_text_shards(listing, input_format, config.input.rows_per_unit, config.input.id_column, False)
    check_text_input(shards, dataclasses.replace(config.input, format=input_format))
    if config.input.messages_column:
        _check_chat_template(config)
    print(
        f"planning: {len(shards)} {input_format} files, {sum(s.num_rows for s in shards)} rows read and checked "
        f"in {time.perf_counter() - started:.1f}s"
    )
    return list(shards)


def _check_chat_template(config: JobConfig) -> None:
    """Chat rows need the target tokenizer's chat template: without one the job fails before any write."""
    if not has_chat_template(config.model.target, dict(config.model.storage_options)):
        raise JobError(
            f"input.messages_column is set but the tokenizer of model.target {config.model.target} has no chat "
            "template (chat_template.jinja, or chat_template in tokenizer_config.json): add one to the model "
            "folder, or give plain prompts through input.prompt_column"
        )


def worker_spec(config: JobConfig, job_id: str) -> WorkerSpec:
    """What every generator needs of the job's config (the CLI's actors and the Ray Data step alike): its
    sections as they are, copied."""
    return WorkerSpec(
        job_id=job_id,
        model=copy.deepcopy(config.model),
        input=copy.deepcopy(config.input),
        output=copy.deepcopy(config.output),
        generation=copy.deepcopy(config.generation),
        workers=copy.deepcopy(config.workers),
        strategy=copy.deepcopy(config.strategy),
        models={name: getattr(config.model, name) for name in optional_models(config)},
    )


def _summary(results: list[UnitResult], committed: dict[str, Any], phases: Phases, total_rows: int) -> dict[str, Any]:
    """The job's counts, and its wall time (from the start of `run_job` to the manifest) with the phases
    that add up to it (`pipeline/phases.py`)."""
    generated, wall_s = sum(r.generated_tokens for r in results), phases.wall_s
    decoding_s = phases.seconds.get("first_batch", 0.0) + phases.seconds.get("decoding", 0.0)
    by_strategy = add_up(r.tokens_by_strategy for r in results)
    by_option = add_up(r.tokens_by_option for r in results)
    return {
        "rows": total_rows,
        "rows_committed": sum(c["rows"] for c in committed.values()),
        "error_rows": sum(c.get("error_rows", 0) for c in committed.values()),
        "rows_this_run": sum(r.num_rows for r in results),
        "generated_tokens_this_run": generated,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(generated / wall_s, 2) if wall_s > 0 else None,
        "decoding_tokens_per_s": round(generated / decoding_s, 2) if decoding_s > 0 else None,
        "phases_s": phases.rounded(),
        "generated_tokens_by_strategy": by_strategy,
        "generated_tokens_by_drafter": by_option,
        "controller_s": {name: round(s, 3) for name, s in add_up(r.exploring for r in results).items()},
        "drafter_faults": {
            drafter: {"faults": count, "first": first}
            for drafter, (count, first) in tally_faults(r.drafter_faults for r in results).items()
        },
    }


def _print_summary(summary: dict[str, Any]) -> None:
    print(
        f"rows {summary['rows_committed']}/{summary['rows']} committed, {summary['error_rows']} error rows; "
        f"this run: {summary['rows_this_run']} rows, {summary['generated_tokens_this_run']} tokens in "
        f"{summary['wall_s']:.1f}s ({summary['tokens_per_s'] or 0:.1f} tokens/s)"
    )
    for name, tokens in sorted(summary["generated_tokens_by_strategy"].items()):
        print(f"  {name}: {tokens} tokens")
    by_drafter = summary["generated_tokens_by_drafter"]
    if by_drafter:
        total = sum(by_drafter.values())
        shares = ", ".join(f"{n} {t / total:.0%}" for n, t in sorted(by_drafter.items(), key=lambda kv: -kv[1]))
        print(f"  drafting rows' tokens by what emitted them: {shares}")
    controlled = summary.get("controller_s", {})
    if controlled.get("decoding_s"):
        decoding, explored, lost = (controlled[k] for k in ("decoding_s", "exploring_s", "exploring_lost_s"))
        print(
            f"  controller: exploring steps {explored:.2f}s of its {decoding:.2f}s of decoding "
            f"({explored / decoding:.1%}); those that lost to plain steps {lost:.2f}s ({lost / decoding:.1%}; "
            f"budget {ControllerSettings.explore_budget:.0%})"
        )
    for drafter, fault in sorted(summary.get("drafter_faults", {}).items()):
        print(
            f"warning: drafter {drafter} faulted {fault['faults']} times (first: {fault['first']}); each time "
            "it was off for the rest of its batch, which decoded plainly: the output is exact but not "
            "accelerated there; see `faults` in the batch records under _logs/batches/",
            file=sys.stderr,
        )
    phases = summary.get("phases_s", {})
    if phases:
        print(
            f"wall time by phase ({summary['decoding_tokens_per_s'] or 0:.1f} tokens/s over first batch and decoding): "
            + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in phases.items())
        )

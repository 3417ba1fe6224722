"""`accelgen`: the command line.

    accelgen generate [CONFIG.yaml] [key=value ...]   run a generation job
    accelgen bench [key=value ...]                     time strategies against transformers' generate
    accelgen train {tokenizer,lm,draft,eval} ...       build the shipped model family
    accelgen verify OUTPUT_URL [--input INPUT_URL]     check a job's output against the output contract
    accelgen report OUTPUT_URL [--out report.html]     one self-contained HTML page of a finished job
    accelgen calibrate calm [CONFIG.yaml] [k=v ...]    pick CALM's measure and threshold for a target
    accelgen twin [CONFIG.yaml] [key=value ...]        the shipped family widened to a real model's shape

A `JobError` is printed as one message and exits with status 2; an incomplete job exits with 1. A
job that ends short of success stops Ray quietly first, so that its message is the last line printed.
The command itself (`run`) stops Ray after any `generate` and leaves without the interpreter's teardown.
"""

from __future__ import annotations

import logging
import os
import sys

from jobs.args import config_or_usage
from jobs.shipped import default_job_config
from pipeline.errors import JobError

USAGE = """usage: accelgen <command> [args]

commands:
  generate [CONFIG.yaml] [key=value ...]   run a generation job (accelgen generate --help lists every key)
  bench [key=value ...]                     benchmark strategies against transformers (accelgen bench --help)
  train <job> [CONFIG.yaml] [key=value ...] build the shipped model family (accelgen train --help)
  verify OUTPUT_URL [--input INPUT_URL]     check an output: one row per input row, manifest, checksums
  report OUTPUT_URL [--out report.html]     a finished job's report: throughput, τ, switches, errors, totals
  calibrate calm [CONFIG.yaml] [k=v ...]    CALM's speed/agreement curve, measure and threshold (--help)
  twin [key=value ...]                      the shipped family at a real model's shape, for speed (--help)
"""


def generate(args: list[str]) -> int:
    config = config_or_usage("usage: accelgen generate [CONFIG.yaml] [key=value ...]", default_job_config(), args)
    if config is None:
        return 0
    from pipeline import markers
    from pipeline.cluster import start_while_importing, stop_ray
    from pipeline.phases import Phases
    from workers.common.storage import filesystem

    phases = Phases()
    status = 2
    try:
        # A job with units to run needs Ray: it starts while the driver imports (`pipeline.cluster`).
        if not markers.finished(*filesystem(config.output.url, dict(config.output.storage_options))):
            start_while_importing(config.ray.address, "pipeline.driver")
            phases.lap("ray_start")
        from pipeline.driver import run_job

        status = {"failed": 1, "interrupted": 143}.get(run_job(config, phases).status, 0)
    finally:
        if status != 0:  # an early exit: what the job or `main` prints ends the output, not Ray's shutdown
            stop_ray()
    return status


def verify(args: list[str]) -> int:
    import argparse
    import json

    from pipeline.verify import verify as check

    parser = argparse.ArgumentParser(prog="accelgen verify", description="Check a job's output against its contract.")
    parser.add_argument("output_url")
    parser.add_argument("--input", dest="input_url", help="the job's input: output row ids must equal its row ids")
    parser.add_argument("--storage-options", default="{}", help="fsspec storage options as JSON (both URLs)")
    parsed = parser.parse_args(args)
    report = check(parsed.output_url, parsed.input_url, json.loads(parsed.storage_options))
    for problem in report.problems:
        print(f"FAIL {problem}")
    verdict = "OK" if report.ok else f"{len(report.problems)} problems"
    print(f"{verdict}: {report.parts} parts, {report.rows} rows in {parsed.output_url}")
    return 0 if report.ok else 1


def report(args: list[str]) -> int:
    import argparse
    import json

    from pipeline.report import write_report

    parser = argparse.ArgumentParser(
        prog="accelgen report", description="Write one self-contained HTML page about a finished job."
    )
    parser.add_argument("output_url")
    parser.add_argument("--out", default="report.html", help="where to write the page (a local file)")
    parser.add_argument("--storage-options", default="{}", help="fsspec storage options as JSON")
    parsed = parser.parse_args(args)
    path = write_report(parsed.output_url, json.loads(parsed.storage_options), parsed.out)
    print(f"report of {parsed.output_url} written to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, args = argv[0], argv[1:]
    try:
        if command == "generate":
            return generate(args)
        if command == "bench":
            from jobs.bench.command import main as bench_main

            return bench_main(args)
        if command == "verify":
            return verify(args)
        if command == "report":
            return report(args)
        if command == "train":
            from jobs.train.cli import main as train_main

            return train_main(args)
        if command == "calibrate":
            from jobs.calibrate import main as calibrate_main

            return calibrate_main(args)
        if command == "twin":
            from jobs.twin.command import main as twin_main

            return twin_main(args)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def run() -> None:
    """The `accelgen` command (and `python -m jobs.cli`): `main`, then, after `generate`, Ray stopped here
    and the process left at once. Left to the interpreter, a finished job would wait on Ray's exit hook
    (which sleeps for late messages) and the teardown of torch, Ray and the rest: seconds of a cold
    job's time outside decoding. By then the output is committed and every file closed: what is left
    to do is Ray's processes, stopped here, and buffered output, flushed."""
    argv = sys.argv[1:]
    status = main(argv)
    if argv[:1] != ["generate"]:
        sys.exit(status)
    from pipeline.cluster import stop_ray

    stop_ray()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    run()

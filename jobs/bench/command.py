"""`accelgen bench`: the keys read and checked once, then the mode they ask for.

Each mode lives in a module of its own, and none of them imports this one: the in-process table
(`jobs/bench/decoding.py`), the cost table (`costs=true`, `jobs/bench/costs.py`), whole jobs
(`job=true`, `jobs/bench/job.py`), structured outputs (`structured=true`, `jobs/bench/structured.py`)
and whole jobs with and without the prefix cache (`prefix=true`, `jobs/bench/prefix.py`).
"""

from __future__ import annotations

import json

from jobs.args import config_or_usage
from jobs.bench import costs, job, prefix, structured
from jobs.bench.decoding import LEGEND, SWEEPS, Bench, print_header, print_rows
from jobs.bench.settings import BenchConfig
from pipeline.errors import JobError
from strategies import registry

USAGE = "usage: accelgen bench [CONFIG.yaml] [key=value ...]"


def main(args: list[str]) -> int:
    config = config_or_usage(USAGE, BenchConfig(), args)
    if config is None:
        return 0
    check(config)
    if config.job:
        return job.main(config)
    if config.structured:
        return structured.main(config)
    if config.prefix:
        report = prefix.main(config)
    elif config.costs:
        report = costs.measure(Bench(config))
        costs.print_table(report)
    else:
        print_header()
        report = Bench(config).run(on_rows=print_rows)
        print(LEGEND)
    if config.report:
        with open(config.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def check(config: BenchConfig) -> None:
    """Fail before any model loads on a strategy the registry lacks, or a sweep's value its option refuses."""
    unknown = sorted(set(config.strategies) - set(registry.available()))
    if unknown:
        raise JobError(f"strategies: unknown {unknown}; available: {', '.join(registry.available())}")
    for sweep in (s for s in SWEEPS if s.allowed is not None):
        unknown_values = sorted(set(getattr(config, sweep.key)) - set(sweep.allowed))
        if unknown_values:
            raise JobError(f"{sweep.key}: unknown {unknown_values}; use {', '.join(sweep.allowed)}")

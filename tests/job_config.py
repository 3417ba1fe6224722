"""The job configuration most tests run: input in `tmp_path/in`, output to `tmp_path/out`, a given model."""

from __future__ import annotations

from pathlib import Path

from jobs.shipped import default_job_config
from pipeline.config import JobConfig, load_config


def job_config(tmp_path: Path, model: Path, *overrides: str) -> JobConfig:
    # The shipped heads, exits and CMLM belong to the shipped target: a test's own target decodes without them.
    base = [
        f"input.url={tmp_path / 'in'}",
        f"output.url={tmp_path / 'out'}",
        f"model.target={model}",
        "model.heads=null",
        "model.exits=null",
        "model.cmlm=null",
        "model.eagle=null",
        # float32, not `auto`: on a CPU with bfloat16 matrix hardware `auto` measures both dtypes and may
        # choose bfloat16 by timing, which would make a test's tokens depend on the machine's load.
        "model.dtype=float32",
    ]
    return load_config(default_job_config(), None, [*base, *overrides])

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
    ]
    return load_config(default_job_config(), None, [*base, *overrides])

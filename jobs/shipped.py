"""The shipped model family and sample prompts, and the job config that runs on them by default."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import JobConfig, ModelConfig
from workers.common.model_kinds import BY_NAME, KINDS

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_MODELS = ASSETS / "models"
SHIPPED_TARGET = SHIPPED_MODELS / "target"
SAMPLE_PROMPTS = ASSETS / "prompts" / "sample.parquet"


def shipped(kind: str) -> Path:
    """Where the shipped family keeps its model of `kind` (`workers/common/model_kinds.py`): `models/<kind>`."""
    return SHIPPED_MODELS / BY_NAME[kind].name


def shipped_or_none(kind: str) -> str | None:
    """The shipped model of `kind` as a URL, or None where this checkout has none (its marker file is missing)."""
    folder = shipped(kind)
    return str(folder) if (folder / BY_NAME[kind].marker).is_file() else None


def default_job_config() -> JobConfig:
    """The schema's defaults, with the shipped model family as the default model."""
    optional = {kind.name: shipped_or_none(kind.name) for kind in KINDS}
    return JobConfig(model=ModelConfig(target=str(SHIPPED_TARGET), **optional))

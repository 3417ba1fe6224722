"""The shipped model family and sample prompts, and the job config that runs on them by default."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import JobConfig, ModelConfig

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_TARGET = ASSETS / "models" / "target"
SHIPPED_DRAFT = ASSETS / "models" / "draft"
SHIPPED_HEADS = ASSETS / "models" / "heads"
SHIPPED_EXITS = ASSETS / "models" / "exits"
SHIPPED_CMLM = ASSETS / "models" / "cmlm"
SHIPPED_EAGLE = ASSETS / "models" / "eagle"
SAMPLE_PROMPTS = ASSETS / "prompts" / "sample.parquet"


def default_job_config() -> JobConfig:
    """The schema's defaults, with the shipped model family as the default model."""
    draft = str(SHIPPED_DRAFT) if (SHIPPED_DRAFT / "config.json").is_file() else None
    heads = str(SHIPPED_HEADS) if (SHIPPED_HEADS / "heads.json").is_file() else None
    exits = str(SHIPPED_EXITS) if (SHIPPED_EXITS / "exits.json").is_file() else None
    cmlm = str(SHIPPED_CMLM) if (SHIPPED_CMLM / "cmlm.json").is_file() else None
    eagle = str(SHIPPED_EAGLE) if (SHIPPED_EAGLE / "eagle.json").is_file() else None
    return JobConfig(
        model=ModelConfig(target=str(SHIPPED_TARGET), draft=draft, heads=heads, exits=exits, cmlm=cmlm, eagle=eagle)
    )

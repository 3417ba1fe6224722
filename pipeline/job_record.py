"""The job record: the job's identity and fingerprint, with its config, versions and lossy
strategies (`_job.json`, and the manifest's head), and which optional models the job uses.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from pipeline.config import JobConfig, to_plain_dict
from pipeline.errors import JobError
from pipeline.fingerprint import AUTO_DTYPE_KEY, fingerprint, identity
from pipeline.lossy import lossy_strategies, unreproducible_sampling
from pipeline.shards import Shard
from workers.common.model_files import check_trained_for_target, is_local, model_weights_hash, resolve_model_dir
from workers.common.model_kinds import BY_NAME, KINDS, ModelKind, needed_by


def job_record(config: JobConfig, shards: list[Shard], auto_dtype: str = "") -> dict[str, Any]:
    """The job's identity and fingerprint (the hash of what decides its rows: input listing, models'
    weights, settings, the dtype `model.dtype=auto` chose by measuring), its config, versions and lossy
    strategies: `_job.json`, and the manifest's head."""
    hashes = {"target": model_hash(config, config.model.target, "model.target")}
    for name in optional_models(config):
        kind = BY_NAME[name]
        hashes[name] = model_hash(config, getattr(config.model, name), kind.key, kind)
        _check_trained_for_target(config, kind)
    ident = identity(config, shards, hashes, auto_dtype)
    return {
        "fingerprint": fingerprint(ident),
        "identity": ident,
        "config": to_plain_dict(config),
        "versions": _versions(),
        "lossy": lossy_strategies(config.strategy),
        "unreproducible_sampling": unreproducible_sampling(config.strategy),
    }


def recorded_auto_dtype(record: dict[str, Any] | None) -> str | None:
    """The dtype `model.dtype=auto` chose by measuring for the job of `record` (its `_job.json`), which a
    resumed job decodes in again; "" where it recorded none (its device decided: float32 on CPU); None
    where there is no record (a new job, which may measure)."""
    if record is None:
        return None
    return record.get("identity", {}).get("model", {}).get(AUTO_DTYPE_KEY, "")


def optional_models(config: JobConfig) -> list[str]:
    """The optional model kinds set and possibly used (a strategy column may name any strategy): loaded,
    and part of the job's identity, only then."""
    wanted = needed_by(config.strategy, any_strategy=bool(config.input.strategy_column))
    return [kind.name for kind in KINDS if kind.name in wanted and getattr(config.model, kind.name)]


def model_hash(config: JobConfig, url: str, key: str, kind: ModelKind | None = None) -> str:
    """The weights hash of the model at `url` (config key `key`): the target, or a folder of `kind`."""
    try:
        if kind is None:
            return model_weights_hash(url, dict(config.model.storage_options))
        return model_weights_hash(url, dict(config.model.storage_options), kind.marker, kind.folder)
    except FileNotFoundError as exc:
        raise JobError(f"{key}: {exc}") from None


def _check_trained_for_target(config: JobConfig, kind: ModelKind) -> None:
    """A folder trained for another target fails the job before anything is written (local folders; the
    actors check remote ones as they load them)."""
    url, target = getattr(config.model, kind.name), config.model.target
    if kind.trained_for is not None and is_local(url) and is_local(target):
        try:
            folder = resolve_model_dir(url, marker=kind.marker, what=kind.folder)
            check_trained_for_target(kind, folder, resolve_model_dir(target), url, target)
        except (ValueError, FileNotFoundError) as exc:
            raise JobError(str(exc)) from None


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("accelgen", "torch", "transformers", "ray", "pyarrow", "fsspec", "omegaconf"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions

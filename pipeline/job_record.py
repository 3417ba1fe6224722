"""The job record: the job's identity and fingerprint, with its config, versions and lossy
strategies (`_job.json`, and the manifest's head), and which optional models the job uses.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from pipeline.config import JobConfig, to_plain_dict
from pipeline.errors import JobError
from pipeline.fingerprint import fingerprint, identity
from pipeline.shards import Shard
from strategies import registry
from workers.model_loading import (
    CMLM_CONFIG,
    EXITS_CONFIG,
    HEADS_CONFIG,
    check_trained_for_target,
    is_local,
    model_weights_hash,
    resolve_model_dir,
)


def job_record(config: JobConfig, shards: list[Shard]) -> dict[str, Any]:
    """The job's identity and fingerprint (the hash of what decides its rows: input listing, models'
    weights, settings), its config, versions and lossy strategies: `_job.json`, and the manifest's head."""
    hashes = {"target": model_hash(config, config.model.target, "model.target")}
    for model in optional_models(config):
        hashes[model] = model_hash(config, getattr(config.model, model), f"model.{model}")
    for kind in ("heads", "exits"):
        if kind in hashes:
            _check_trained_for_target(config, kind)
    ident = identity(config, shards, hashes)
    return {
        "fingerprint": fingerprint(ident),
        "identity": ident,
        "config": to_plain_dict(config),
        "versions": _versions(),
        "lossy": _lossy(config),
    }


def optional_models(config: JobConfig) -> list[str]:
    """The optional models (`draft`, `heads`, `exits`, `cmlm`) set and possibly used: loaded, and part of the
    job's identity, only then."""
    # A strategy column may name any strategy.
    if config.input.strategy_column:
        wanted = set(registry.OPTIONAL_MODELS)
    else:
        wanted = registry.needs_models(config.strategy.name, config.strategy)
    return sorted(m for m in wanted if getattr(config.model, m))


def _lossy(config: JobConfig) -> dict[str, str]:
    """Strategies of the job that may emit other tokens than the target would, and why (the manifest
    says so: empty means every row is the target's own output)."""
    names = [config.strategy.name, *(config.strategy.candidates if config.strategy.name == registry.AUTO else [])]
    reasons = {n: registry.lossy_reason(n, config.strategy) for n in names}
    return {n: r for n, r in reasons.items() if r is not None}


def model_hash(config: JobConfig, url: str, key: str) -> str:
    try:
        marker = {"model.heads": HEADS_CONFIG, "model.exits": EXITS_CONFIG, "model.cmlm": CMLM_CONFIG}.get(
            key, "config.json"
        )
        return model_weights_hash(url, dict(config.model.storage_options), marker=marker)
    except FileNotFoundError as exc:
        raise JobError(f"{key}: {exc}") from None


def _check_trained_for_target(config: JobConfig, kind: str) -> None:
    """Heads or exits trained for another target fail the job before anything is written (local
    folders; the actors check remote ones as they load them)."""
    url, target = getattr(config.model, kind), config.model.target
    if is_local(url) and is_local(target):
        try:
            folder = resolve_model_dir(url, marker=f"{kind}.json")
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

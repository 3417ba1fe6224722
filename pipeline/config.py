"""The typed job configuration: one schema, YAML plus `key=value` overrides, checked before any work.

Every field carries its help text in `metadata["help"]`; `describe()` turns the schema into the
`--help` listing, so the documentation of a key cannot drift from its definition. Options of one
strategy nest under its name (`strategy.<name>.<option>`); options shared by several strategies sit
directly under `strategy`.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.errors import JobError
from strategies.config_option import option
from strategies.options import StrategyOptions
from workers.common.sections import (
    GenerationConfig,
    InputConfig,
    ModelConfig,
    OutputConfig,
    WorkersConfig,
)


@dataclass
class RayConfig:
    address: str = option("", "Ray cluster to join (auto, ray://host:port). Empty: start an embedded local one.")


@dataclass
class JobConfig:
    input: InputConfig = field(default_factory=InputConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: StrategyOptions = field(default_factory=StrategyOptions)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    ray: RayConfig = field(default_factory=RayConfig)


T = typing.TypeVar("T")


def load_config(base: T, yaml_path: str | None, overrides: list[str]) -> T:
    """Merge `base` (a dataclass instance holding the defaults), a YAML file and `key=value` overrides.

    Unknown keys, wrong types and missing required keys are `JobError`s naming the key and the source.
    """
    schema = OmegaConf.structured(base)
    layers: list[tuple[str, DictConfig]] = []
    if yaml_path:
        try:
            layers.append((yaml_path, OmegaConf.load(yaml_path)))
        except FileNotFoundError:
            raise JobError(f"config file {yaml_path} does not exist") from None
        except Exception as exc:
            raise JobError(f"config file {yaml_path} is not valid YAML: {exc}") from None
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise JobError(f"overrides must be key=value, got {bad!r} (example: generation.max_new_tokens=64)")
    try:
        layers.append(("command line", OmegaConf.from_dotlist(overrides)))
    except OmegaConfBaseException as exc:
        raise JobError(f"could not parse overrides {overrides!r}: {exc}") from None
    merged = schema
    for source, layer in layers:
        unknown = _unknown_keys(schema, OmegaConf.to_container(layer), "")
        if unknown:
            valid = [key for key, _, _ in describe(base)]
            raise JobError(f"{source}: " + "; ".join(_unknown_key_message(key, valid) for key in unknown))
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise JobError(f"{source}: {_omegaconf_message(exc)}") from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise JobError(f"missing required config keys: {', '.join(missing)} (set them in the YAML or as key=value)")
    return typing.cast(T, OmegaConf.to_object(merged))


def _unknown_keys(schema: DictConfig, layer: Any, prefix: str) -> list[str]:
    """Dotted keys of `layer` that the schema does not have, found before merging so that every
    misspelt key is reported at once, under its full name (a misspelt section names the keys below it)."""
    if not isinstance(layer, dict):
        return []
    unknown = []
    known = set(schema.keys())  # `in schema` is False for a required key not yet set
    for name, value in layer.items():
        key = f"{prefix}{name}"
        if name not in known:
            unknown.extend(_leaf_keys(value, key))
            continue
        # Sections descend; free-form dicts (storage options, custom resources) take any key.
        if dataclasses.is_dataclass(OmegaConf.get_type(schema, name)):
            unknown.extend(_unknown_keys(schema[name], value, key + "."))
    return unknown


def _leaf_keys(value: Any, key: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for name, child in value.items() for leaf in _leaf_keys(child, f"{key}.{name}")]
    return [key]


def _unknown_key_message(key: str, valid: list[str]) -> str:
    """Name the nearest valid keys: a typo or an abbreviation is the usual cause of an unknown key."""
    close = _nearest(key, valid)
    if not close:
        return f"unknown config key '{key}' (--help lists every key)"
    return f"unknown config key '{key}': did you mean " + " or ".join(f"`{c}`" for c in close) + "?"


def _nearest(key: str, valid: list[str]) -> list[str]:
    """Keys of the same section compared by their last part (a shared section name says nothing about
    similarity), a prefix counting as a match (`temp` -> `temperature`) and so does a key holding every
    word of the one given (`max_tokens` -> `max_new_tokens`, not `min_tokens`); keys of an unknown
    section compared whole. The best, and those within 0.1 of it, up to three."""
    section, _, leaf = key.rpartition(".")
    siblings = [v for v in valid if v.rpartition(".")[0] == section]
    if siblings:
        scores = {v: _leaf_score(leaf, v.rpartition(".")[2]) for v in siblings}
    else:
        scores = {v: _similarity(key, v) for v in valid}
    best = max(scores.values(), default=0.0)
    ranked = sorted((v for v, score in scores.items() if score >= max(0.6, best - 0.1)), key=lambda v: -scores[v])
    return ranked[:3]


def _leaf_score(given: str, known: str) -> float:
    words = set(given.split("_")) <= set(known.split("_"))
    return _similarity(given, known) + max(known.startswith(given), words)


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    first_line = str(exc).splitlines()[0]
    return f"config key '{key}': {first_line}" if key else first_line


def describe(config: Any, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every leaf of a config dataclass, in declaration order."""
    rows = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            rows.extend(describe(value, key + "."))
        else:
            default = "(required)" if value == MISSING else repr(value)
            rows.append((key, default, f.metadata.get("help", "")))
    return rows


def to_plain_dict(config: Any) -> dict[str, Any]:
    """The config as plain JSON-able data, with every storage option's value redacted."""
    data = OmegaConf.to_container(OmegaConf.structured(config), resolve=True)
    for section in ("input", "output", "model"):
        options = data.get(section, {}).get("storage_options")
        if options:
            data[section]["storage_options"] = {k: "<redacted>" for k in options}
    return data

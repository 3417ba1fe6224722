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
from strategies.options import StrategyOptions
from workers.model_kinds import BY_NAME, KINDS

DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text; mutable defaults go through `default_factory`."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass
class InputConfig:
    url: str = option(MISSING, "Parquet input: a file, a directory or a glob; any fsspec URL (s3://, gs://, …).")
    prompt_column: str = option("prompt", "Column holding the prompt text.")
    id_column: str | None = option(
        None, "Column holding a unique row id. Empty: ids are derived from shard path and row index."
    )
    messages_column: str | None = option(
        None,
        "Column of chat messages (a list of {role, content} structs, or JSON text of one), rendered through "
        "the tokenizer's chat template with the generation prompt. Set: input.prompt_column is not read.",
    )
    keep_columns: list[str] = option([], "Input columns copied unchanged into the output.")
    strategy_column: str | None = option(
        None, "Optional column naming a strategy per row (empty values: strategy.name); unknown: an error row."
    )
    params_columns: dict[str, str] = option(
        {},
        "Per-row settings: {setting: column} for settings among max_new_tokens, temperature, top_p, stop, seed; "
        "a row's non-null value overrides generation.<setting>, a bad one makes an error row.",
    )
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the input (endpoint, credentials).")
    rows_per_unit: int = option(
        4096, "Shards with more rows are split into work units of whole row groups up to about this size."
    )


@dataclass
class OutputConfig:
    url: str = option(MISSING, "Output folder; any fsspec URL. Parts, manifest, _SUCCESS and _logs/ go here.")
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the output.")
    logprobs: bool = option(
        False,
        "Add `logprobs`: each generated token's log-probability under the target (raw log-softmax of its "
        "logits, before temperature and top-k/top-p).",
    )
    top_logprobs: int = option(
        0, "Add `top_logprobs`: per generated token, the target's k most likely tokens (at most max_top_logprobs)."
    )
    max_top_logprobs: int = option(
        20,
        "Ceiling of top_logprobs (vLLM's max_logprobs default): each generated token stores k entries, so a large k "
        "multiplies the output's size. Raise it to ask for more.",
    )
    token_ids: bool = option(False, "Add `token_ids`: the generated token ids.")


def _model_config() -> type:
    """`model.*`: the target, one key per optional model kind (`workers/model_kinds.py`: a new kind is a
    new key without an edit here), and how every model loads."""
    fields = [
        ("target", str, option(MISSING, "Hugging Face causal LM: a local directory or an fsspec URL of one.")),
        *((kind.name, str | None, option(None, kind.help)) for kind in KINDS),
        ("dtype", str, option("auto", f"One of {DTYPES}. auto: float32 on CPU, bfloat16 on GPU.")),
        ("trust_remote_code", bool, option(False, "Allow model code shipped with the checkpoint to run.")),
        (
            "compile",
            bool,
            option(
                False,
                "torch.compile each layer's parts around attention (Llama-family targets): fewer, fused operations "
                "per step, after a compile of tens of seconds per actor (README, 'torch.compile of the decode step').",
            ),
        ),
        ("cache_dir", str, option("", "Where remote models are downloaded. Empty: ~/.cache/accelgen/models.")),
        (
            "storage_options",
            dict[str, Any],
            option(
                {},
                f"fsspec storage options for models at URLs (target, {', '.join(BY_NAME)}): endpoint, credentials.",
            ),
        ),
    ]
    config = dataclasses.make_dataclass("ModelConfig", fields)
    config.__module__ = __name__  # where pickling (Ray) finds it
    return config


ModelConfig = _model_config()


@dataclass
class GenerationConfig:
    max_new_tokens: int = option(128, "Most tokens generated per row (finish_reason=length when reached).")
    temperature: float = option(0.0, "0: greedy decoding. >0: sampling at this temperature.")
    top_p: float = option(1.0, "Nucleus sampling mass, in (0, 1].")
    top_k: int = option(0, "Sample among the k most likely tokens; 0: no limit.")
    stop: list[str] = option([], "Stop strings: end the row (finish_reason=stop); not part of the completion.")
    seed: int = option(0, "Sampling seed; a row's draws are keyed by (seed, row_id, position).")
    ignore_eos: bool = option(False, "Keep generating past EOS (fixed-length runs, benchmarks).")
    n: int = option(
        1,
        "Completions per input row: n output rows, sample_index 0..n-1, each drawn with its own key "
        "(seed, row_id, sample_index, position). n > 1 needs temperature > 0.",
    )


@dataclass
class WorkersConfig:
    num_actors: int = option(0, "Generator actors. 0: one per GPU of the cluster, or one CPU actor without GPUs.")
    batch_size: int = option(
        16, "Most rows decoding at once on an actor, from any of its units: rows join as others finish."
    )
    max_batch_tokens: int = option(
        16384, "Most prompt + max_new_tokens tokens of the rows decoding at once (a longer row decodes alone)."
    )
    num_gpus_per_actor: float = option(1.0, "GPUs reserved per actor when the cluster has GPUs.")
    num_cpus_per_actor: float = option(
        1.0, "CPUs reserved per actor. At least one CPU of the cluster always stays free for Ray's own tasks."
    )
    custom_resources: dict[str, float] = option(
        {}, "Ray custom resources each actor needs (e.g. {accelerator_type_H100: 0.001}) to pin actors to nodes."
    )
    torch_threads: int = option(
        0,
        "torch intra-op threads per actor. 0: the cluster's cores less one for the driver and Ray, shared among "
        "the actors (at least one).",
    )
    actor_start_timeout_s: float = option(
        300.0, "Fail the job when the actors are not scheduled and loaded within this many seconds."
    )
    max_unit_attempts: int = option(3, "Attempts per work unit before the unit is reported failed.")
    unit_timeout_s: float = option(
        900.0, "An attempt that finishes no batch for this long is taken as hung: its actor restarts, the unit retries."
    )
    controller_stats_url: str | None = option(
        None,
        "A shared controller statistics file (fsspec URL, output.storage_options): read at the start of a job, "
        "updated at its end, so that the next job's controllers start warm for the same target, device and dtype. "
        "Empty: only the output's own _logs/controller_stats.json (a resumed job reads it).",
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
    similarity), a prefix counting as a match (`temp` -> `temperature`); keys of an unknown section
    compared whole. The best, and those within 0.1 of it, up to three."""
    section, _, leaf = key.rpartition(".")
    siblings = [v for v in valid if v.rpartition(".")[0] == section]
    if siblings:
        scores = {v: _similarity(leaf, v.rpartition(".")[2]) + v.rpartition(".")[2].startswith(leaf) for v in siblings}
    else:
        scores = {v: _similarity(key, v) for v in valid}
    best = max(scores.values(), default=0.0)
    ranked = sorted((v for v, score in scores.items() if score >= max(0.6, best - 0.1)), key=lambda v: -scores[v])
    return ranked[:3]


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

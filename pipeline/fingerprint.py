"""A job's identity: a hash of everything that decides its output rows, and nothing else.

In: the input listing (names, sizes, modification stamps), the columns read, the target and every
optional model the job uses (`workers/common/model_kinds.py`: path and weights hash), the dtype (and
the dtype `model.dtype=auto` chose on CPU by measuring, `workers/common/dtype_choice.py`), the
generation and strategy settings, and the columns asked for (token ids, log-probabilities). Out:
credentials and storage options, actor counts, batch sizes, the Ray address — changing those must resume a job,
not start a different one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pipeline.config import JobConfig
from pipeline.input_formats import formats_identity
from pipeline.shards import Shard
from workers.common.model_kinds import KINDS
from workers.common.row_settings import LATER_SETTINGS

FORMAT_VERSION = 1
AUTO_DTYPE_KEY = "dtype_chosen"  # under the identity's "model"


def identity(
    config: JobConfig, shards: list[Shard], model_hashes: dict[str, str], auto_dtype: str = ""
) -> dict[str, Any]:
    """The fields the fingerprint hashes, as data (kept in `_job.json` so a mismatch can be explained).
    `model_hashes`: the weights hash of the target and of each optional model the job uses, by kind.
    `auto_dtype`: what `model.dtype=auto` chose by measuring on CPU; "": no choice was measured (the
    device alone decided), and the identity is what it was before such choices were made."""
    return {
        "format_version": FORMAT_VERSION,
        "input": [[s.name, s.size, s.stamp] for s in shards],
        "columns": {
            "prompt": config.input.prompt_column,
            "id": config.input.id_column,
            "keep": list(config.input.keep_columns),
            "strategy": config.input.strategy_column,
            "params": dict(sorted(config.input.params_columns.items())),
            **({"messages": config.input.messages_column} if config.input.messages_column else {}),
        },
        "model": {
            "target": config.model.target,
            # An unused draft was always written as None: the ids of jobs without one stay what they were.
            "draft": None,
            **{kind.name: getattr(config.model, kind.name) for kind in KINDS if kind.name in model_hashes},
            "dtype": config.model.dtype,
            **({AUTO_DTYPE_KEY: auto_dtype} if auto_dtype else {}),
            "weights_sha256": model_hashes,
        },
        "generation": _settings(config.generation, "generation"),
        "scores": {
            "logprobs": config.output.logprobs,
            "top_logprobs": config.output.top_logprobs,
            "token_ids": config.output.token_ids,
        },
        "strategy": _settings(config.strategy, "strategy"),
        **formats_identity(config.output.format, shards),
    }


# Keys added after jobs were first identified: part of the identity only when set away from their
# default, so that an output written before they existed keeps its identity and resumes.
LATER_KEYS = {"generation": LATER_SETTINGS, "strategy": ("reproducible_sampling",)}


def _settings(section: Any, name: str) -> dict[str, Any]:
    """A config section's values as the identity holds them: every key, but a later key at its default."""
    defaults = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(section)
    }
    values = dataclasses.asdict(section)
    return {k: v for k, v in values.items() if k not in LATER_KEYS[name] or v != defaults[k]}


def fingerprint(ident: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def changed_shards(old: dict[str, Any], new: dict[str, Any]) -> set[int] | None:
    """Indices of shards whose size or stamp changed, when nothing else differs; None otherwise.

    A job may resume over such a change if none of those shards has a committed unit: the rows
    already committed were decided by files that did not change (a corrupt shard fixed after its
    unit failed is the usual case).
    """
    same_rest = {k: v for k, v in old.items() if k != "input"} == {k: v for k, v in new.items() if k != "input"}
    old_input, new_input = old.get("input", []), new.get("input", [])
    if not same_rest or [s[0] for s in old_input] != [s[0] for s in new_input]:
        return None
    return {i for i, (a, b) in enumerate(zip(old_input, new_input, strict=True)) if a != b}


def difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two identities, in words: a refusal to resume should say what changed."""
    said = []
    settings = sorted(k for k in set(old) | set(new) if k != "input" and old.get(k) != new.get(k))
    if settings:
        said.append("the " + ", ".join(settings) + " settings differ")
    before = {s[0]: s for s in old.get("input", [])}
    after = {s[0]: s for s in new.get("input", [])}
    for what, names in (
        ("added", sorted(set(after) - set(before))),
        ("removed", sorted(set(before) - set(after))),
        ("changed", sorted(n for n in set(before) & set(after) if before[n] != after[n])),
    ):
        if names:
            said.append(f"{len(names)} input shards {what} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})")
    return "; ".join(said) or "the identity format differs"

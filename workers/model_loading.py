"""Loading a Hugging Face causal LM and its tokenizer, and a job's optional models, from a local folder
or any fsspec URL (`workers.common.model_files` finds the folder and checks it against the target).

Each optional kind's loader lives here (`LOADERS`), beside the torch it needs, not in the table of
kinds (`workers.common.model_kinds`) that the driver reads without torch."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from strategies.artifacts.cmlm import CMLM, read_config
from strategies.artifacts.eagle import EagleHead, load_eagle
from strategies.artifacts.exits import ExitHeads, load_exits
from strategies.artifacts.heads import DraftHeads, load_heads
from strategies.registry import Models
from strategies.runtime.prefix_cache import prefix_cache_of
from strategies.runtime.runner import ModelRunner
from workers.common.model_files import check_trained_for_target, resolve_model_dir
from workers.common.model_kinds import BY_NAME, ModelKind

DTYPE_NAMES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_dtype(name: str, device: torch.device, auto_on_cpu: str = "") -> torch.dtype:
    """`auto` is bfloat16 on GPU, and on CPU the job's choice `auto_on_cpu` (`workers.common.dtype_choice`),
    float32 until one is made."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else DTYPE_NAMES[auto_on_cpu or "float32"]
    return DTYPE_NAMES[name]


def load_model(
    path: Path, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model in eval mode on `device`, and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    return model.to(device).eval(), tokenizer


def check_extends_vocabulary(
    tokenizer: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, what: str, target_what: str
) -> None:
    """A ValueError naming both unless every token of `target` has the same id in `tokenizer` (which may
    add tokens of its own after them: a CMLM's mask and length tokens)."""
    vocab = tokenizer.get_vocab()
    differ = [token for token, i in target.get_vocab().items() if vocab.get(token) != i]
    if differ:
        raise ValueError(
            f"{what} does not extend the tokenizer of {target_what} ({len(differ)} tokens differ, e.g. "
            f"{differ[0]!r}): distill a CMLM for this target (accelgen train cmlm target=…)"
        )


@dataclass(frozen=True)
class Loading:
    """What a model kind's loader is given: how to load, and the job's target, already loaded."""

    dtype: torch.dtype
    device: torch.device
    trust_remote_code: bool
    target_url: str
    target: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    prefix_cache_mb: float | None = None  # each prefilling runner's prefix cache (None: none)


def _load_draft(folder: Path, url: str, at: Loading) -> ModelRunner:
    model, tokenizer = load_model(folder, at.dtype, at.device, at.trust_remote_code)
    if tokenizer.get_vocab() != at.tokenizer.get_vocab():
        raise ValueError(
            f"model.draft {url} has a different tokenizer than model.target {at.target_url}: "
            "a draft must share the target's vocabulary"
        )
    runner = ModelRunner(model)
    runner.prefix_cache = prefix_cache_of(at.prefix_cache_mb)  # its prompts are the target's: worth a cache too
    runner.prepack()  # loaded as its strategy is made, before decoding: not on its first draft
    return runner


def _load_heads(folder: Path, url: str, at: Loading) -> DraftHeads:
    loaded = load_heads(folder, at.dtype, at.device)
    loaded.use_lm_head(at.target.get_output_embeddings().weight)
    return loaded


def _load_exits(folder: Path, url: str, at: Loading) -> ExitHeads:
    loaded = load_exits(folder, at.dtype, at.device)
    loaded.use_lm_head(at.target.get_output_embeddings().weight)
    return loaded


def _load_cmlm(folder: Path, url: str, at: Loading) -> CMLM:
    model, tokenizer = load_model(folder, at.dtype, at.device, at.trust_remote_code)
    check_extends_vocabulary(tokenizer, at.tokenizer, f"model.cmlm {url}", f"model.target {at.target_url}")
    runner = ModelRunner(model)
    runner.prepack()  # as the draft model's: before decoding, not on its first draft
    return CMLM(runner, read_config(folder))


def _load_eagle(folder: Path, url: str, at: Loading) -> EagleHead:
    loaded = load_eagle(folder, at.dtype, at.device)
    loaded.use_target(at.target)
    return loaded


# (local folder, its URL, the job's loading) -> the model of one kind, checked against the target.
Loader = Callable[[Path, str, Loading], Any]

LOADERS: dict[str, Loader] = {
    "draft": _load_draft,
    "heads": _load_heads,
    "exits": _load_exits,
    "cmlm": _load_cmlm,
    "eagle": _load_eagle,
}
if set(LOADERS) != set(BY_NAME):  # a kind of the table without its loader, or a loader of no kind
    raise ImportError(f"model kinds {sorted(BY_NAME)} and their loaders {sorted(LOADERS)} differ")


@dataclass
class LoadedModels:
    """A job's (or bench's) models, loaded: the Hugging Face modules and the runners strategies use."""

    tokenizer: PreTrainedTokenizerBase
    target: torch.nn.Module
    models: Models
    target_load_s: float  # resolving, then reading the target's tokenizer and weights

    @property
    def draft(self) -> torch.nn.Module | None:
        """The draft's Hugging Face module, loading it now if it was left to load on first use."""
        runner = self.models.get("draft")
        return runner.model if runner is not None else None


def load_models(
    target_url: str,
    dtype: torch.dtype,
    device: torch.device,
    optional: Mapping[str, str | None] | None = None,
    cache_dir: str = "",
    trust_remote_code: bool = False,
    storage_options: dict[str, Any] | None = None,
    lazy: bool = False,
    prefix_cache_mb: float | None = None,
) -> LoadedModels:
    """The target, and the optional models given by kind (`optional`: {"draft": URL, …}; a None URL is
    not given), each checked against the target by its kind. `storage_options` reach every model at a URL.

    `lazy`: the optional models load (and are checked) only when a strategy that uses them is first
    created (`Models.get`); an actor whose strategies never use one never reads it.

    `prefix_cache_mb`: the target's and the draft model's prefix caches (`model.prefix_cache_mb`; None:
    none, so that a bench or a test prefills every prompt whole unless it asks).
    """
    given = {name: url for name, url in (optional or {}).items() if url}
    unknown = sorted(set(given) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown model kinds {unknown}: the kinds are {', '.join(BY_NAME)}")
    began = time.perf_counter()
    target_dir = resolve_model_dir(target_url, cache_dir, storage_options)
    target, tokenizer = load_model(target_dir, dtype, device, trust_remote_code)
    target_load_s = time.perf_counter() - began
    at = Loading(dtype, device, trust_remote_code, target_url, target, tokenizer, prefix_cache_mb)

    def loader(kind: ModelKind, url: str) -> Callable[[], Any]:
        def load() -> Any:
            folder = resolve_model_dir(url, cache_dir, storage_options, kind.marker, kind.folder)
            check_trained_for_target(kind, folder, target_dir, url, target_url)
            return LOADERS[kind.name](folder, url, at)

        return load

    runner = ModelRunner(target)
    runner.prefix_cache = prefix_cache_of(prefix_cache_mb)
    models = Models(runner, loaders={name: loader(BY_NAME[name], url) for name, url in given.items()})
    if not lazy:
        for name in list(models.loaders):
            models.get(name)
    return LoadedModels(tokenizer, target, models, target_load_s)

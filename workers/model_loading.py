"""Loading a Hugging Face causal LM and its tokenizer from a local folder or any fsspec URL.

Remote models are copied once into a local cache (staged under a temporary name, then renamed, so a
crash mid-download never leaves a half model that looks complete). A model's identity for the job
fingerprint is the hash of its files' contents, cached per (path, size, mtime) so a rerun does
not hash gigabytes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from strategies.registry import Models
from strategies.runtime.runner import ModelRunner
from workers.model_kinds import BY_NAME, ModelKind

DTYPE_NAMES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
_HASH_CACHE = Path.home() / ".cache" / "accelgen" / "model_hashes.json"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "accelgen" / "models"


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def resolve_model_dir(
    url: str,
    cache_dir: str = "",
    storage_options: dict[str, Any] | None = None,
    marker: str = "config.json",
    what: str = "a Hugging Face model",
) -> Path:
    """A local folder holding the model at `url` (a folder with the file `marker`, `what` in an error:
    a model kind's `marker` and `folder`), downloading it into the cache when remote."""
    if is_local(url):
        path = Path(url.removeprefix("file://")).expanduser()
        if not (path / marker).is_file():
            raise FileNotFoundError(f"folder {path} has no {marker}: point it at {what}")
        return path
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    local = root / hashlib.sha256(url.encode()).hexdigest()[:24]
    if (local / marker).is_file():
        return local
    fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
    staging = root / f".{local.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in fs.ls(remote, detail=False):
        if fs.isfile(name):
            fs.get(name, str(staging / Path(name).name))
    if not (staging / marker).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise FileNotFoundError(f"URL {url} has no {marker}: point it at {what}")
    try:
        staging.rename(local)
    except OSError:  # another actor on this node finished the same download first
        shutil.rmtree(staging, ignore_errors=True)
    return local


def model_weights_hash(
    url: str,
    storage_options: dict[str, Any] | None = None,
    marker: str = "config.json",
    what: str = "a Hugging Face model",
) -> str:
    """sha256 over the model's files (names and contents); remote models hash their listing's checksums.
    `marker` and `what` as for `resolve_model_dir`."""
    if not is_local(url):
        fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
        infos = sorted((info for info in fs.ls(remote, detail=True) if info["type"] == "file"), key=lambda i: i["name"])
        listing = [
            (Path(i["name"]).name, i.get("size"), str(i.get("ETag") or i.get("etag") or i.get("mtime"))) for i in infos
        ]
        return hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    path = resolve_model_dir(url, marker=marker, what=what)
    return _files_sha256(sorted(p for p in path.iterdir() if p.is_file()))


def has_chat_template(url: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether the tokenizer of the model folder at `url` has a chat template, from its files alone (no
    download): `chat_template.jinja` (what transformers 5 saves), `chat_template.json`, or a
    `chat_template` entry of `tokenizer_config.json`."""
    fs, root = fsspec.core.url_to_fs(url.removeprefix("file://"), **(storage_options or {}))
    if any(fs.exists(f"{root}/{name}") for name in ("chat_template.jinja", "chat_template.json")):
        return True
    config = f"{root}/tokenizer_config.json"
    return fs.exists(config) and bool(json.loads(fs.cat_file(config)).get("chat_template"))


def weights_sha256(model_dir: Path) -> str:
    """sha256 over a local model folder's `*.safetensors` files (names and contents): the weights'
    identity wherever the folder was copied, which heads record as the target they were trained for."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model folder {model_dir} holds no *.safetensors weights")
    return _files_sha256(files)


def _files_sha256(files: list[Path]) -> str:
    """sha256 over `files` (names and contents), cached per (path, size, mtime) across runs."""
    stamp = json.dumps([(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files])
    cache = _read_hash_cache()
    if stamp in cache:
        return cache[stamp]
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + b"\0")
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    cache[stamp] = digest.hexdigest()
    _HASH_CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = _HASH_CACHE.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache))
    tmp.replace(_HASH_CACHE)
    return cache[stamp]


def _read_hash_cache() -> dict[str, str]:
    try:
        return json.loads(_HASH_CACHE.read_text())
    except (OSError, ValueError):
        return {}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is float32 on CPU (bf16 matmuls are slow there) and bfloat16 on GPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
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


def check_trained_for_target(kind: ModelKind, folder: Path, target_dir: Path, folder_url: str, target_url: str) -> None:
    """A ValueError naming both when the folder of `kind` was trained for other weights than the
    target's: heads read its last hidden states, exits its intermediate ones, and another model's
    states mean nothing to them."""
    if kind.trained_for is None:
        return
    trained_for = kind.trained_for(folder)
    actual = weights_sha256(target_dir)
    if trained_for.target_weights_sha256 != actual:
        key, name = kind.key, kind.name
        raise ValueError(
            f"{key} {folder_url} were trained for the target at {trained_for.target_path} (weights sha256 "
            f"{trained_for.target_weights_sha256[:12]}…), not for model.target {target_url} ({actual[:12]}…): "
            f"train {name} for this target (accelgen train {name} target={target_url}), point {key} at "
            f"its own, or set {key}=null to decode without {name}"
        )


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
) -> LoadedModels:
    """The target, and the optional models given by kind (`optional`: {"draft": URL, …}; a None URL is
    not given), each checked against the target by its kind. `storage_options` reach every model at a URL.

    `lazy`: the optional models load (and are checked) only when a strategy that uses them is first
    created (`Models.get`); an actor whose strategies never use one never reads it.
    """
    given = {name: url for name, url in (optional or {}).items() if url}
    unknown = sorted(set(given) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown model kinds {unknown}: the kinds are {', '.join(BY_NAME)}")
    began = time.perf_counter()
    target_dir = resolve_model_dir(target_url, cache_dir, storage_options)
    target, tokenizer = load_model(target_dir, dtype, device, trust_remote_code)
    target_load_s = time.perf_counter() - began
    at = Loading(dtype, device, trust_remote_code, target_url, target, tokenizer)

    def loader(kind: ModelKind, url: str) -> Callable[[], Any]:
        def load() -> Any:
            folder = resolve_model_dir(url, cache_dir, storage_options, kind.marker, kind.folder)
            check_trained_for_target(kind, folder, target_dir, url, target_url)
            return kind.load(folder, url, at)

        return load

    models = Models(ModelRunner(target), loaders={name: loader(BY_NAME[name], url) for name, url in given.items()})
    if not lazy:
        for name in list(models.loaders):
            models.get(name)
    return LoadedModels(tokenizer, target, models, target_load_s)

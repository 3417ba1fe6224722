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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from strategies.artifacts.cmlm import CMLM
from strategies.artifacts.cmlm import CONFIG_FILE as CMLM_CONFIG
from strategies.artifacts.cmlm import read_config as read_cmlm_config
from strategies.artifacts.exits import CONFIG_FILE as EXITS_CONFIG
from strategies.artifacts.exits import ExitHeads, load_exits
from strategies.artifacts.exits import read_config as read_exits_config
from strategies.artifacts.heads import CONFIG_FILE as HEADS_CONFIG
from strategies.artifacts.heads import DraftHeads, load_heads
from strategies.artifacts.heads import read_config as read_heads_config
from strategies.registry import Models
from strategies.runtime.runner import ModelRunner

DTYPE_NAMES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
_HASH_CACHE = Path.home() / ".cache" / "accelgen" / "model_hashes.json"


_READ_CONFIG = {"heads": read_heads_config, "exits": read_exits_config}


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "accelgen" / "models"


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def resolve_model_dir(
    url: str, cache_dir: str = "", storage_options: dict[str, Any] | None = None, marker: str = "config.json"
) -> Path:
    """A local folder holding the model (or heads: `marker` heads.json; exits: exits.json) at `url`,
    downloading it into the cache when remote."""
    if is_local(url):
        path = Path(url.removeprefix("file://")).expanduser()
        if not (path / marker).is_file():
            what = {
                HEADS_CONFIG: "a folder `accelgen train heads` wrote",
                EXITS_CONFIG: "a `train exits` folder",
                CMLM_CONFIG: "a `train cmlm` folder",
            }.get(marker, "a Hugging Face model")
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
        raise FileNotFoundError(f"URL {url} has no {marker}: point it at a model (or heads) folder")
    try:
        staging.rename(local)
    except OSError:  # another actor on this node finished the same download first
        shutil.rmtree(staging, ignore_errors=True)
    return local


def model_weights_hash(url: str, storage_options: dict[str, Any] | None = None, marker: str = "config.json") -> str:
    """sha256 over the model's files (names and contents); remote models hash their listing's checksums."""
    if not is_local(url):
        fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
        infos = sorted((info for info in fs.ls(remote, detail=True) if info["type"] == "file"), key=lambda i: i["name"])
        listing = [
            (Path(i["name"]).name, i.get("size"), str(i.get("ETag") or i.get("etag") or i.get("mtime"))) for i in infos
        ]
        return hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    path = resolve_model_dir(url, marker=marker)
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


def check_trained_for_target(kind: str, folder: Path, target_dir: Path, folder_url: str, target_url: str) -> None:
    """A ValueError naming both when the `kind` folder (`heads`, `exits`) was trained for other weights
    than the target's: heads read its last hidden states, exits its intermediate ones, and another
    model's states mean nothing to them."""
    trained_for = _READ_CONFIG[kind](folder)
    actual = weights_sha256(target_dir)
    if trained_for.target_weights_sha256 != actual:
        raise ValueError(
            f"model.{kind} {folder_url} were trained for the target at {trained_for.target_path} (weights sha256 "
            f"{trained_for.target_weights_sha256[:12]}…), not for model.target {target_url} ({actual[:12]}…): "
            f"train {kind} for this target (accelgen train {kind} target={target_url}), point model.{kind} at "
            f"its own, or set model.{kind}=null to decode without {kind}"
        )


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
    draft_url: str | None = None,
    heads_url: str | None = None,
    cache_dir: str = "",
    trust_remote_code: bool = False,
    exits_url: str | None = None,
    cmlm_url: str | None = None,
    storage_options: dict[str, Any] | None = None,
    lazy: bool = False,
) -> LoadedModels:
    """The target, and the draft, heads, exits and CMLM when given (`storage_options` reach every one at
    a URL), each checked against the target: a draft must share its vocabulary, a CMLM extend it, heads
    and exits must have been trained for its weights.

    `lazy`: the optional models load (and are checked) only when a strategy that uses them is first
    created (`Models.get`); an actor whose strategies never use one never reads it.
    """
    began = time.perf_counter()
    target_dir = resolve_model_dir(target_url, cache_dir, storage_options)
    target, tokenizer = load_model(target_dir, dtype, device, trust_remote_code)
    target_load_s = time.perf_counter() - began

    def draft() -> ModelRunner:
        draft_dir = resolve_model_dir(draft_url, cache_dir, storage_options)
        model, draft_tokenizer = load_model(draft_dir, dtype, device, trust_remote_code)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"model.draft {draft_url} has a different tokenizer than model.target {target_url}: "
                "a draft must share the target's vocabulary"
            )
        return ModelRunner(model)

    def heads() -> DraftHeads:
        heads_dir = resolve_model_dir(heads_url, cache_dir, storage_options, marker=HEADS_CONFIG)
        check_trained_for_target("heads", heads_dir, target_dir, heads_url, target_url)
        loaded = load_heads(heads_dir, dtype, device)
        loaded.use_lm_head(target.get_output_embeddings().weight)
        return loaded

    def exits() -> ExitHeads:
        exits_dir = resolve_model_dir(exits_url, cache_dir, storage_options, marker=EXITS_CONFIG)
        check_trained_for_target("exits", exits_dir, target_dir, exits_url, target_url)
        loaded = load_exits(exits_dir, dtype, device)
        loaded.use_lm_head(target.get_output_embeddings().weight)
        return loaded

    def cmlm() -> CMLM:
        cmlm_dir = resolve_model_dir(cmlm_url, cache_dir, storage_options, marker=CMLM_CONFIG)
        cmlm_model, cmlm_tokenizer = load_model(cmlm_dir, dtype, device, trust_remote_code)
        check_extends_vocabulary(cmlm_tokenizer, tokenizer, f"model.cmlm {cmlm_url}", f"model.target {target_url}")
        return CMLM(ModelRunner(cmlm_model), read_cmlm_config(cmlm_dir))

    given = {
        "draft": (draft_url, draft),
        "heads": (heads_url, heads),
        "exits": (exits_url, exits),
        "cmlm": (cmlm_url, cmlm),
    }
    models = Models(ModelRunner(target), loaders={name: load for name, (url, load) in given.items() if url})
    if not lazy:
        for name in list(models.loaders):
            models.get(name)
    return LoadedModels(tokenizer, target, models, target_load_s)

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
from pathlib import Path
from typing import Any

import fsspec
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

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


def resolve_model_dir(url: str, cache_dir: str = "", storage_options: dict[str, Any] | None = None) -> Path:
    """A local folder holding the model at `url`, downloading it into the cache when remote."""
    if is_local(url):
        path = Path(url.removeprefix("file://")).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model folder {path} has no config.json: point model.target at a Hugging Face model"
            )
        return path
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    local = root / hashlib.sha256(url.encode()).hexdigest()[:24]
    if (local / "config.json").is_file():
        return local
    fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
    staging = root / f".{local.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in fs.ls(remote, detail=False):
        if fs.isfile(name):
            fs.get(name, str(staging / Path(name).name))
    if not (staging / "config.json").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise FileNotFoundError(f"model URL {url} has no config.json: point it at a Hugging Face model folder")
    try:
        staging.rename(local)
    except OSError:  # another actor on this node finished the same download first
        shutil.rmtree(staging, ignore_errors=True)
    return local


def model_weights_hash(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """sha256 over the model's files (names and contents); remote models hash their listing's checksums."""
    if not is_local(url):
        fs, remote = fsspec.core.url_to_fs(url, **(storage_options or {}))
        infos = sorted((info for info in fs.ls(remote, detail=True) if info["type"] == "file"), key=lambda i: i["name"])
        listing = [
            (Path(i["name"]).name, i.get("size"), str(i.get("ETag") or i.get("etag") or i.get("mtime"))) for i in infos
        ]
        return hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    path = resolve_model_dir(url)
    return _files_sha256(sorted(p for p in path.iterdir() if p.is_file()))


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

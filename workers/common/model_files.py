"""A model's files, without loading them: a local folder for a model at any fsspec URL, the files'
identity for the job fingerprint, what the tokenizer's files say, and whether a folder of heads, exits
or an EAGLE head was trained for the target. The driver reads these before any actor loads a model;
none needs torch (`workers.model_loading` loads).

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

from workers.common.model_kinds import ModelKind

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


def local_weights_bytes(url: str) -> int | None:
    """The bytes of the `*.safetensors` weights of the model folder at `url`, if it is local (None
    otherwise, or where it holds none): what a decode step reads, up to the dtype's width."""
    if not is_local(url):
        return None
    files = list(Path(url.removeprefix("file://")).expanduser().glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) or None


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

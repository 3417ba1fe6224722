"""The table of optional model kinds is the one list: the config schema, the job's identity, the worker
spec, the loaders and the strategies' models all cover exactly its kinds, and a job's id follows every
model it uses."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from job_config import job_config

from pipeline.checks import validate
from pipeline.config import ModelConfig, describe
from pipeline.driver import worker_spec
from pipeline.errors import JobError
from pipeline.job_record import job_record
from pipeline.shards import list_shards
from strategies import registry
from strategies.artifacts.configs import EagleConfig, ExitsConfig, HeadsConfig, write_weights_config
from strategies.options import StrategyOptions
from workers.common.model_files import weights_sha256
from workers.common.model_kinds import BY_NAME, KINDS, needed_by
from workers.model_loading import load_models

MODEL_SETTINGS = {
    "target",
    "dtype",
    "trust_remote_code",
    "compile",
    "pack_weights",
    "prefix_cache_mb",
    "cache_dir",
    "storage_options",
}


def _draft_folder(folder: Path, target: Path) -> None:
    (folder / "config.json").write_text("{}")


def _heads_folder(folder: Path, target: Path) -> None:
    trained_for = {"target_path": str(target), "target_weights_sha256": weights_sha256(target)}
    write_weights_config(folder, "heads", HeadsConfig(num_heads=1, hidden_size=32, vocab_size=8, **trained_for))


def _exits_folder(folder: Path, target: Path) -> None:
    trained_for = {"target_path": str(target), "target_weights_sha256": weights_sha256(target)}
    write_weights_config(folder, "exits", ExitsConfig([1], num_layers=2, hidden_size=32, vocab_size=8, **trained_for))


def _cmlm_folder(folder: Path, target: Path) -> None:
    (folder / "cmlm.json").write_text("{}")


def _eagle_folder(folder: Path, target: Path) -> None:
    trained_for = {"target_path": str(target), "target_weights_sha256": weights_sha256(target)}
    write_weights_config(folder, "eagle", EagleConfig(32, 8, 4, 2, 8, 64, **trained_for))


# A folder of each kind that passes the job's checks before any load (marker, trained for the target).
FOLDERS = {
    "draft": _draft_folder,
    "heads": _heads_folder,
    "exits": _exits_folder,
    "cmlm": _cmlm_folder,
    "eagle": _eagle_folder,
}


def _folder(root: Path, name: str, target: Path) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    FOLDERS[name](folder, target)
    (folder / "weights.bin").write_bytes(b"first weights")
    return folder


def test_every_part_covers_exactly_the_tables_kinds(tmp_path, tiny_model_dir):
    names = {kind.name for kind in KINDS}
    assert set(FOLDERS) == names == set(BY_NAME)
    schema = {f.name for f in dataclasses.fields(ModelConfig)} - MODEL_SETTINGS
    assert schema == names
    helps = {key: help for key, _, help in describe(ModelConfig(target="t"), "model.")}
    assert all(helps[kind.key] == kind.help for kind in KINDS)
    # The strategies hold every kind, and need none outside the table.
    assert registry.models_needed(StrategyOptions(name="auto")) == names
    assert set().union(*(needed_by(StrategyOptions(name=n)) for n in registry.available())) == names
    # Rows may name any strategy: the worker spec carries every kind the job sets.
    folders = {name: str(_folder(tmp_path, name, tiny_model_dir)) for name in names}
    config = job_config(
        tmp_path, tiny_model_dir, "input.strategy_column=s", *(f"model.{n}={u}" for n, u in folders.items())
    )
    assert worker_spec(config, "job").models == folders
    with pytest.raises(ValueError, match="unknown model kinds"):
        load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"no_such_kind": "x"})


@pytest.mark.parametrize("kind", [kind.name for kind in KINDS])
def test_changing_any_model_of_a_finished_job_makes_a_rerun_a_different_job(tmp_path, tiny_model_dir, kind):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["x = 1"], "s": ["autoregressive"]}), tmp_path / "in" / "a.parquet")
    folders = {name: _folder(tmp_path / "models", name, tiny_model_dir) for name in FOLDERS}
    shards = list_shards(str(tmp_path / "in"), {})

    def job_id(**models: Path) -> str:
        given = {**folders, **models}
        config = job_config(
            tmp_path, tiny_model_dir, "input.strategy_column=s", *(f"model.{n}={u}" for n, u in given.items())
        )
        return job_record(config, shards)["fingerprint"]

    first = job_id()
    assert job_id() == first
    moved = tmp_path / "moved" / kind
    shutil.copytree(folders[kind], moved)  # the same files elsewhere
    assert job_id(**{kind: moved}) != first
    (folders[kind] / "weights.bin").write_bytes(b"retrained weights")  # other files in the same place
    assert job_id() != first


def test_a_strategy_without_its_model_kind_names_the_key_and_the_role(tmp_path, tiny_model_dir):
    for name, kind in (("medusa", "heads"), ("calm", "exits"), ("mask_predict", "cmlm"), ("speculative", "draft")):
        config = job_config(tmp_path, tiny_model_dir, f"strategy.name={name}", "model.draft=null")
        with pytest.raises(JobError, match=re.escape(f"strategy {name} needs {BY_NAME[kind].role}: set model.{kind}")):
            validate(config)

"""Models load from a local folder or any fsspec URL (downloaded once into a cache)."""

from __future__ import annotations

import dataclasses

import fsspec
import pytest
from job_config import job_config

from pipeline.driver import worker_spec
from workers.common.model_files import model_weights_hash, resolve_model_dir
from workers.generator import Generator


def test_remote_model_is_downloaded_once_into_the_cache(tmp_path, tiny_model_dir):
    fs = fsspec.filesystem("memory")
    for path in tiny_model_dir.iterdir():
        fs.pipe(f"/models/tiny/{path.name}", path.read_bytes())
    local = resolve_model_dir("memory://models/tiny", cache_dir=str(tmp_path / "cache"))
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    fs.rm("/models/tiny/config.json")  # a second resolve uses the cache, not the URL
    assert resolve_model_dir("memory://models/tiny", cache_dir=str(tmp_path / "cache")) == local
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        resolve_model_dir("memory://models/tiny", cache_dir=str(tmp_path / "other-cache"))


def test_weights_hash_follows_contents(tmp_path, tiny_model_dir):
    first = model_weights_hash(str(tiny_model_dir))
    assert first == model_weights_hash(str(tiny_model_dir))
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tiny_model_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert model_weights_hash(str(copy)) == first
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(weights))
    assert model_weights_hash(str(copy)) != first
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        model_weights_hash(str(tmp_path))


def test_an_actor_loads_the_draft_once_and_only_for_a_strategy_that_drafts_with_it(
    tmp_path, tiny_model_dir, tiny_draft_dir
):
    config = job_config(
        tmp_path,
        tiny_model_dir,
        "strategy.name=auto",
        "strategy.candidates=[prompt_lookup]",
        f"model.draft={tiny_draft_dir}",
    )
    # A draft among auto's candidates' models would be part of the job; these candidates use none.
    assert worker_spec(config, "job").models == {}
    spec = dataclasses.replace(worker_spec(config, "job"), models={"draft": str(tiny_draft_dir)})
    generator = Generator(spec)
    assert generator.models.loaded.get("draft") is None and "draft" not in generator.ready()["load_s"]
    generator._strategy("prompt_lookup")
    assert generator.models.loaded.get("draft") is None
    speculative = generator._strategy("speculative")
    draft = generator.models.loaded.get("draft")
    assert draft is not None and speculative.drafters["speculative"].proposer.draft is draft
    loaded = generator.ready()["load_s"]
    assert set(loaded) == {"target", "draft"} and loaded["draft"] > 0
    generator._strategies.clear()
    generator._strategy("speculative")
    assert generator.models.loaded.get("draft") is draft and generator.ready()["load_s"]["draft"] == loaded["draft"]


@pytest.mark.parametrize(
    ("keys", "packs"), [((), True), (("model.pack_weights=false",), False), (("model.dtype=float64",), False)]
)
def test_an_actor_reports_the_weights_it_packs_for_onednn(tmp_path, tiny_model_dir, keys, packs, monkeypatch):
    """The ready line's account: the target's weight bytes packed beside its own in float32 on CPU where
    its warm-up chose packing at some row count (scripted here: at all of them, then at none); 0 with
    `model.pack_weights=false` (the process's matmuls then run `F.linear`) or in float64."""
    from strategies.runtime import linear
    from strategies.runtime.runner import ModelRunner

    before, by_rows = linear.packing(), dict(linear._by_rows)
    try:
        for everywhere in (True, False):
            kernel = linear.ONEDNN if everywhere else linear.F_LINEAR
            monkeypatch.setattr(
                ModelRunner, "pack_where_faster", lambda self, batch_size, plain_steps_only=False, k=kernel: {1: k}
            )
            generator = Generator(worker_spec(job_config(tmp_path, tiny_model_dir, *keys), "job"))
            weights = sum(p.numel() * p.element_size() for p in generator.runner.model.parameters())
            assert generator.ready()["packed_bytes"] == (weights if packs and before and everywhere else 0)
            assert linear.packing() == (before and "model.pack_weights=false" not in keys)
    finally:
        linear.set_packing(before)
        linear.pack_by_rows(by_rows)

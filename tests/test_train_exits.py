"""`train exits`: exits that learn to agree with the final layer, exact resumption, a folder naming its target."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model
from killed_run import killed_then_rerun, same_weights
from safetensors.torch import load_file

from jobs.train.cli import main
from jobs.train.exits import balanced_accuracy, balanced_bce
from jobs.train.samplers import WindowSampler
from strategies.artifacts.configs import read_exits_config
from strategies.artifacts.exits import CONFIG_FILE, WEIGHTS_FILE, load_exits
from workers.common.model_files import weights_sha256
from workers.model_loading import load_models

TINY_EXITS = [
    "corpus.max_files=40",
    "corpus.heldout_percent=25",
    "train.steps=6",
    "train.batch_size=2",
    "train.seq_len=32",
    "train.checkpoint_every=2",
    "eval_windows=4",
    "exits.adapter_rank=4",
    "optim.lr=0.01",
    "optim.warmup_steps=2",
]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-3-layers"), seed=3, layers=3)


@pytest.fixture(scope="module")
def exits_dir(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exits")
    assert main(["exits", f"target={target_dir}", f"output_dir={out}", *TINY_EXITS]) == 0
    return out


def test_saved_folder_loads_names_its_target_and_reports_agreement(exits_dir: Path, target_dir: Path) -> None:
    assert sorted(p.name for p in exits_dir.iterdir()) == sorted(["checkpoint", CONFIG_FILE, WEIGHTS_FILE])
    config = read_exits_config(exits_dir)
    assert config.layers == [1, 2] and config.num_layers == 3 and config.classifier
    assert config.target_weights_sha256 == weights_sha256(target_dir) and config.target_path == str(target_dir)
    report = config.training["heldout_agreement"]
    assert [r["layer"] for r in report] == [1, 2]
    assert all(0.0 <= r["agreement"] <= 1.0 and 0.0 <= r["logit_lens_agreement"] <= 1.0 for r in report)
    for r in report:  # each classifier beside "always no", the baseline it must beat
        assert r["always_no_accuracy"] == pytest.approx(1 - r["agreement"], abs=1e-4)
        assert 0.0 <= r["classifier_accuracy"] <= 1.0 and 0.0 <= r["classifier_balanced_accuracy"] <= 1.0
    assert "lm_head" not in load_file(exits_dir / WEIGHTS_FILE)  # the LM head is the target's, never saved
    exits = load_exits(exits_dir, torch.float64, torch.device("cpu"))
    assert any(not torch.equal(m.up.weight, torch.zeros_like(m.up.weight)) for m in exits.exits.values())
    loaded = load_models(str(target_dir), torch.float32, torch.device("cpu"), {"exits": str(exits_dir)})
    assert loaded.models.get("exits").layers == [1, 2]


def test_interrupted_run_resumes_to_the_uninterrupted_exits(
    exits_dir: Path, target_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    args = ["exits", f"target={target_dir}", f"output_dir={tmp_path}", *TINY_EXITS]
    checkpointed, rerun = killed_then_rerun(main, args, WindowSampler, 5, tmp_path, monkeypatch, capsys)
    assert checkpointed == 4 and "resuming from step 4/6" in rerun
    assert same_weights(tmp_path / WEIGHTS_FILE, exits_dir / WEIGHTS_FILE)
    record = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert record["training"]["steps"] == 6


def test_user_errors_name_the_key(target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["exits", f"target={target_dir}", f"output_dir={tmp_path}", "exits.layers=[3]"]) == 2
    assert "exits.layers=[3]" in capsys.readouterr().err


def test_classifier_loss_weighs_each_class_equally() -> None:
    # One agreeing position among four: plain BCE would weigh it 1/4, the balanced loss 1/2.
    scores = torch.tensor([0.0, 0.0, 0.0, 2.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    log2, softplus2 = math.log(2), math.log(1 + math.exp(2))
    expected = 0.5 * log2 + 0.5 * (log2 + log2 + softplus2) / 3
    assert balanced_bce(scores, labels).item() == pytest.approx(expected)
    plain = torch.nn.functional.binary_cross_entropy_with_logits(scores, labels).item()
    assert plain == pytest.approx((3 * log2 + softplus2) / 4) and plain != pytest.approx(expected)
    # Always "no" on 1 agreeing position in 4 costs the rare class as much as the common one.
    always_no = torch.tensor([-3.0, -3.0, -3.0, -3.0])
    assert balanced_bce(always_no, labels).item() == pytest.approx(
        0.5 * math.log(1 + math.exp(3)) + 0.5 * math.log(1 + math.exp(-3))
    )
    # A batch of one class is that class's mean loss.
    assert balanced_bce(torch.tensor([0.0, 2.0]), torch.zeros(2)).item() == pytest.approx((log2 + softplus2) / 2)


def test_balanced_accuracy_scores_always_no_at_one_half() -> None:
    assert balanced_accuracy(0, 4, 96, 96) == 0.5  # "always no": 96% accurate, balanced 0.5
    assert balanced_accuracy(1, 4, 90, 96) == pytest.approx(0.5 * (1 / 4 + 90 / 96))
    assert balanced_accuracy(0, 0, 3, 4) == 0.75  # a class absent from the data is left out

"""`train eagle`: self-distillation that lowers its loss, exact resumption, a folder for its target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs.train import checkpoint
from jobs.train.cli import main
from jobs.train.heads import SequenceSampler
from strategies.artifacts.eagle import read_config
from workers.model_loading import weights_sha256

TINY_EAGLE = [
    "corpus.max_files=40",
    "corpus.heldout_percent=25",
    "data.sequences=8",
    "data.prompt_tokens=8",
    "data.continuation_tokens=16",
    "data.batch_size=8",
    "data.eval_sequences=4",
    "eval.depth=3",
    "eval.new_tokens=8",
    "train.steps=8",
    "train.batch_size=4",
    "train.checkpoint_every=4",
    "optim.lr=0.01",
    "optim.warmup_steps=2",
]


@pytest.fixture(scope="module")
def eagle_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eagle")
    assert main(["eagle", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_EAGLE]) == 0
    return out


def test_saved_folder_names_its_target_and_records_held_out_acceptance(eagle_dir: Path, tiny_model_dir: Path):
    config = read_config(eagle_dir)
    assert config.target_weights_sha256 == weights_sha256(tiny_model_dir)
    training = config.training
    assert training["steps"] == 8 and training["tokens_seen"] == 8 * 4 * 23
    for tree in ("chain", "static", "dynamic"):
        measured = training["heldout_acceptance"][tree]
        assert 1 <= len(measured["acceptance_by_depth"]) <= 3 and measured["tau"] >= 1
    record = json.loads((eagle_dir / "eagle.json").read_text())
    assert record["format"] == "accelgen-eagle"


def test_training_lowers_the_loss(tiny_model_dir: Path, tmp_path: Path):
    losses = {}
    for steps in (1, 30):
        out = tmp_path / f"steps{steps}"
        args = [*TINY_EAGLE, f"train.steps={steps}", "train.checkpoint_every=30", "optim.warmup_steps=1"]
        assert main(["eagle", f"target={tiny_model_dir}", f"output_dir={out}", *args]) == 0
        losses[steps] = read_config(out).training["train_loss"]
    assert losses[30] < 0.8 * losses[1]


class Interrupted(Exception):
    pass


def test_interrupted_run_resumes_to_the_uninterrupted_head(
    tiny_model_dir: Path, eagle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    real_batch = SequenceSampler.batch

    def batch_until_step_6(self: SequenceSampler, step: int, config: object) -> torch.Tensor:
        if step == 6:  # after the checkpoint of step 4: steps 5 and 6's work is lost and must be redone
            raise Interrupted
        return real_batch(self, step, config)

    args = ["eagle", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_EAGLE]
    monkeypatch.setattr(SequenceSampler, "batch", batch_until_step_6)
    with pytest.raises(Interrupted):
        main(args)
    monkeypatch.undo()
    assert torch.load(tmp_path / "checkpoint" / checkpoint.STATE_FILE, weights_only=True)["step"] == 4
    capsys.readouterr()
    assert main(args) == 0
    assert "resuming from step 4/8" in capsys.readouterr().out
    resumed, whole = load_file(tmp_path / "eagle.safetensors"), load_file(eagle_dir / "eagle.safetensors")
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_user_errors_name_the_key(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    args = ["eagle", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_EAGLE]
    assert main([*args, "noise=-1"]) == 2
    assert "noise=-1" in capsys.readouterr().err

"""`train eagle`: self-distillation that lowers its loss, exact resumption, a folder for its target, and a
draft vocabulary counted on the corpus (with training, or alone for a trained head)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from killed_run import killed_then_rerun, same_weights
from safetensors.torch import load_file

from jobs.train.cli import main
from jobs.train.config import CorpusConfig
from jobs.train.corpus import load_corpus
from jobs.train.draft_vocab import most_frequent
from jobs.train.samplers import SequenceSampler
from jobs.train.tokenizer import encode_documents, load_tokenizer
from strategies.artifacts.configs import read_eagle_config
from strategies.artifacts.draft_vocab import DRAFT_VOCAB_FILE
from strategies.artifacts.eagle import load_eagle
from workers.common.model_files import weights_sha256

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
    "draft_vocab=64",
]


@pytest.fixture(scope="module")
def eagle_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eagle")
    assert main(["eagle", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_EAGLE]) == 0
    return out


def test_saved_folder_names_its_target_and_records_held_out_acceptance(eagle_dir: Path, tiny_model_dir: Path):
    config = read_eagle_config(eagle_dir)
    assert config.target_weights_sha256 == weights_sha256(tiny_model_dir)
    training = config.training
    assert training["steps"] == 8 and training["tokens_seen"] == 8 * 4 * 23
    for tree in ("chain", "static", "dynamic"):
        measured = training["heldout_acceptance"][tree]
        assert 1 <= len(measured["acceptance_by_depth"]) <= 3 and measured["tau"] >= 1
    record = json.loads((eagle_dir / "eagle.json").read_text())
    assert record["format"] == "accelgen-eagle"


def test_most_frequent_ranks_tokens_by_count_lower_id_first_on_ties():
    token_ids, counts = most_frequent(torch.tensor([5, 2, 5, 7, 2, 5, 0]), vocab_size=8, size=3)
    assert token_ids.tolist() == [5, 2, 0] and counts.tolist() == [3, 2, 1]  # 0 and 7 tie at 1: 0 first


def test_the_draft_vocabulary_is_the_training_splits_most_frequent_tokens(eagle_dir: Path, tiny_model_dir: Path):
    config = read_eagle_config(eagle_dir)
    assert config.draft_vocab_size == 64 and config.training["draft_vocab"]["size"] == 64
    saved = load_file(eagle_dir / DRAFT_VOCAB_FILE)
    corpus = load_corpus(CorpusConfig(max_files=40, heldout_percent=25))
    tokens = encode_documents(load_tokenizer(str(tiny_model_dir)), corpus.train)
    token_ids, counts = most_frequent(tokens, config.vocab_size, 64)
    assert torch.equal(saved["token_ids"], token_ids) and torch.equal(saved["counts"], counts)
    assert config.training["draft_vocab"]["coverage"] == round(counts.sum().item() / len(tokens), 4)
    head = load_eagle(eagle_dir, torch.float32, torch.device("cpu"))
    assert torch.equal(head.draft_ids, token_ids)


def test_draft_vocab_only_rewrites_the_vocabulary_and_never_the_weights(
    eagle_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    out = tmp_path / "head"
    shutil.copytree(eagle_dir, out)
    weights = (out / "eagle.safetensors").read_bytes()
    args = ["eagle", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_EAGLE, "draft_vocab_only=true"]
    (out / DRAFT_VOCAB_FILE).write_bytes(b"not safetensors")  # a broken vocabulary is written anew
    assert main([*args, "draft_vocab=32"]) == 0
    config = read_eagle_config(out)
    assert config.draft_vocab_size == 32 and len(load_file(out / DRAFT_VOCAB_FILE)["token_ids"]) == 32
    assert config.training["heldout_acceptance"]["static"]["tau"] >= 1
    assert config.training["train_loss"] == read_eagle_config(eagle_dir).training["train_loss"]  # the record is kept
    assert (out / "eagle.safetensors").read_bytes() == weights
    assert main([*args, "draft_vocab=0"]) == 0  # the whole vocabulary: no file, nothing announced
    assert read_eagle_config(out).draft_vocab_size == 0 and not (out / DRAFT_VOCAB_FILE).exists()
    assert load_eagle(out, torch.float32, torch.device("cpu")).draft_ids is None
    capsys.readouterr()
    nothing_trained = ["eagle", f"target={tiny_model_dir}", f"output_dir={tmp_path / 'none'}", *TINY_EAGLE]
    assert main([*nothing_trained, "draft_vocab_only=true"]) == 2
    assert "draft_vocab_only=true needs the head trained in output_dir" in capsys.readouterr().err
    assert main([*args, "draft_vocab=100000"]) == 2
    assert "draft_vocab=100000: use 0 (the whole vocabulary) or at most the target's" in capsys.readouterr().err


def test_training_lowers_the_loss(tiny_model_dir: Path, tmp_path: Path):
    losses = {}
    for steps in (1, 30):
        out = tmp_path / f"steps{steps}"
        args = [*TINY_EAGLE, f"train.steps={steps}", "train.checkpoint_every=30", "optim.warmup_steps=1"]
        assert main(["eagle", f"target={tiny_model_dir}", f"output_dir={out}", *args]) == 0
        losses[steps] = read_eagle_config(out).training["train_loss"]
    assert losses[30] < 0.8 * losses[1]


def test_interrupted_run_resumes_to_the_uninterrupted_head(
    tiny_model_dir: Path, eagle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    args = ["eagle", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_EAGLE]
    checkpointed, rerun = killed_then_rerun(main, args, SequenceSampler, 6, tmp_path, monkeypatch, capsys)
    assert checkpointed == 4 and "resuming from step 4/8" in rerun  # steps 5 and 6 redone
    assert same_weights(tmp_path / "eagle.safetensors", eagle_dir / "eagle.safetensors")


def test_user_errors_name_the_key(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    args = ["eagle", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_EAGLE]
    assert main([*args, "noise=-1"]) == 2
    assert "noise=-1" in capsys.readouterr().err

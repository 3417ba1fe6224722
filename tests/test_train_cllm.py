"""`train cllm`: Jacobi trajectories end at greedy decoding, training lowers the consistency loss, exact resumption."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from killed_run import killed_then_rerun, same_weights
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.train import checkpoint, cllm
from jobs.train.cli import main
from jobs.train.cllm import DATA_SUBDIR, collect_trajectories, initial_guesses, jacobi_blocks
from jobs.train.cllm_loss import StateSampler, block_logits, cllm_losses
from jobs.train.cllm_trajectories import Trajectories, block_statistics, trajectory_statistics
from jobs.train.config import TrainConfig
from strategies.runtime.runner import ModelRunner

PROMPT, BLOCK, BLOCKS = 8, 4, 3
TINY_CLLM = [
    "corpus.max_files=40",
    "corpus.heldout_percent=25",
    "data.prompts=8",
    f"data.prompt_tokens={PROMPT}",
    f"data.block_size={BLOCK}",
    f"data.blocks={BLOCKS}",
    "data.batch_size=4",
    "eval.prompts=4",
    "eval.heldout_tokens=256",
    "eval.seq_len=64",
    "train.steps=6",
    "train.batch_size=4",
    "train.checkpoint_every=2",
    "train.threads=1",  # tiny matrices: one thread is many times faster on a busy machine
    "train.save_dtype=float16",
    "optim.lr=0.01",
    "optim.warmup_steps=2",
]


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cllm_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cllm")
    assert main(["cllm", f"target={tiny_model_dir}", f"output_dir={out}", *TINY_CLLM]) == 0
    return out


def greedy(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Plain greedy decoding with a full forward per token: [P] -> [P + new_tokens]."""
    sequence = prompt[None]  # [1, L]
    with torch.no_grad():
        for _ in range(new_tokens):
            choice = model(input_ids=sequence).logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
            sequence = torch.cat([sequence, choice], dim=1)
    return sequence[0]


def test_trajectories_end_at_greedy_decoding(tiny_model_dir: Path, one_thread: None) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()  # no near-tie flips
    prompts = torch.randint(2, model.config.vocab_size, (5, PROMPT), generator=torch.Generator().manual_seed(0))
    data = collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, seed=0, eos=frozenset(), desc="test")
    assert data.sequences.shape == (5, PROMPT + BLOCKS * BLOCK) and data.states.shape[1] == BLOCK
    assert sorted((row, k) for row, k, _, _ in data.blocks.tolist()) == [(r, k) for r in range(5) for k in range(3)]
    for row, k, first, count in data.blocks.tolist():
        states = data.states[first : first + count]  # [J+1, n]
        start = PROMPT + k * BLOCK
        assert torch.equal(states[-1], greedy(model, prompts[row], BLOCKS * BLOCK)[start : start + BLOCK])
        assert 1 <= count <= BLOCK + 1  # at most n iterations
        assert not (states[:-1] == states[-1]).all(-1).any()  # the fixed point is reached once, at the end
    assert 1.0 <= trajectory_statistics(data)["tokens_per_iteration"] <= BLOCK


def test_batched_collection_equals_one_prompt_at_a_time(tiny_model_dir: Path, one_thread: None) -> None:
    """Prompts of 3, 8 and 5 tokens, left-padded in one batch: each row's fixed points and every state
    of its trajectories are those of the row decoded alone, and the fixed points are greedy decoding.

    The random model's attention is sharpened and strengthened (queries and its output scaled up) so
    that its choices depend on positions: with the guesses' positions counted on the padded slot axis
    instead of each row's own tokens, this test fails (checked by hand); at the random weights, whose
    tied embeddings make each choice mostly the input token's, it would not."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= 30
            layer.self_attn.o_proj.weight *= 30
    runner = ModelRunner(model)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, model.config.vocab_size, (length,), generator=generator) for length in (3, 8, 5)]
    guesses = torch.randint(2, model.config.vocab_size, (3, BLOCKS, BLOCK), generator=generator)  # [B, K, n]
    fixed, trajectories = jacobi_blocks(runner, prompts, guesses)  # [B, K*n], [K][B] of [count, n]
    for b, prompt in enumerate(prompts):
        alone_fixed, alone = jacobi_blocks(runner, [prompt], guesses[b : b + 1])
        assert torch.equal(fixed[b], alone_fixed[0])
        assert all(torch.equal(trajectories[k][b], alone[k][0]) for k in range(BLOCKS))
        assert torch.equal(fixed[b], greedy(model, prompt, BLOCKS * BLOCK)[len(prompt) :])
    assert any(len(trajectories[k][b]) > 2 for k in range(BLOCKS) for b in range(3))  # guesses took refining


def test_initial_guesses_do_not_depend_on_the_batch() -> None:
    prompts = torch.arange(40).view(4, 10)  # [N, P]
    together = initial_guesses(prompts, 0, BLOCK, BLOCKS, seed=3)  # [4, K, n]
    assert torch.equal(together[2:], initial_guesses(prompts[2:], 2, BLOCK, BLOCKS, seed=3))
    assert all(set(together[b].flatten().tolist()) <= set(prompts[b].tolist()) for b in range(4))


class Killed(Exception):
    pass


def test_a_killed_collection_resumes_to_the_uninterrupted_trajectories(tiny_model_dir: Path, one_thread: None) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    prompts = torch.randint(2, model.config.vocab_size, (5, PROMPT), generator=torch.Generator().manual_seed(4))
    whole = collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, seed=0, eos=frozenset(), desc="test")
    saved: list[Trajectories] = []

    def save_then_die(partial: Trajectories) -> None:
        saved.append(partial)
        if len(saved) == 2:  # after the second batch of two prompts
            raise Killed

    with pytest.raises(Killed):
        collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, 0, frozenset(), "test", save=save_then_die)
    assert len(saved[-1].sequences) == 4
    resumed = collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, 0, frozenset(), "test", done=saved[-1])
    for field in ("sequences", "states", "blocks"):
        assert torch.equal(getattr(resumed, field), getattr(whole, field))


def test_a_row_stops_after_the_block_holding_eos(tiny_model_dir: Path, one_thread: None) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    prompts = torch.randint(2, model.config.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    everything = collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, seed=0, eos=frozenset(), desc="test")
    eos = int(everything.sequences[0, PROMPT])  # row 0's first greedy token ends its first block
    stopped = collect_trajectories(model, prompts, BLOCK, BLOCKS, 2, seed=0, eos=frozenset({eos}), desc="test")
    rows = stopped.blocks[:, 0].tolist()
    assert rows.count(0) == 1 and torch.equal(stopped.sequences, everything.sequences)


def test_statistics_of_a_handmade_trajectory() -> None:
    states = torch.tensor(
        [
            [9, 9, 3, 9],  # token 2 is already right
            [1, 9, 3, 9],  # one token fixed; token 2 kept while token 1 is wrong: stationary
            [1, 2, 3, 4],  # three tokens fixed in one iteration: two fast-forwarded
        ]
    )
    assert block_statistics(states) == (2, 2, 1)
    data = Trajectories(torch.zeros(1, 4, dtype=torch.long), states, torch.tensor([[0, 0, 0, 3]]), prompt_tokens=0)
    assert trajectory_statistics(data) == {
        "blocks": 1,
        "iterations_per_block": 2.0,
        "tokens_per_iteration": 2.0,
        "fast_forwarded_per_block": 2.0,
        "stationary_per_block": 1.0,
    }


def test_state_batches_are_a_pure_function_of_seed_and_step() -> None:
    counts = torch.tensor([3, 1, 5, 2])  # block 1 is a fixed point from its guess: no state to train on
    config = TrainConfig(batch_size=3)
    first, again = StateSampler(counts, seed=1), StateSampler(counts, seed=1)
    assert torch.equal(first.batch(4, config), again.batch(4, config))
    picks = torch.cat([first.batch(s, config) for s in range(4)])  # [12, 2]: four epochs of three blocks
    assert sorted(picks[:3, 0].tolist()) == [0, 2, 3]
    assert bool((picks[:, 1] < counts[picks[:, 0]] - 1).all())  # never the fixed point itself


def load_trajectories(cllm_dir: Path) -> Trajectories:
    state = torch.load(cllm_dir / "checkpoint" / DATA_SUBDIR / checkpoint.STATE_FILE, weights_only=True)
    return Trajectories(state["sequences"], state["states"], state["blocks"], state["prompt_tokens"], state["corpus"])


def test_packed_rows_give_the_logits_of_separate_forwards(cllm_dir: Path, tiny_model_dir: Path) -> None:
    data = load_trajectories(cllm_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    blocks = data.blocks.tolist()
    picks = torch.tensor(
        [(next(e for e, (_, k, _, count) in enumerate(blocks) if k == wanted and count > 1), 0) for wanted in (2, 0, 1)]
    )  # [3, 2]: contexts of three lengths in one batch
    with torch.no_grad():
        on_state, on_fixed, state, fixed = block_logits(model, data, picks)  # [B, n, V] x 2, [B, n] x 2
        for b, (e, _) in enumerate(picks.tolist()):
            row, k, first, count = blocks[e]
            assert torch.equal(fixed[b], data.states[first + count - 1]) and torch.equal(state[b], data.states[first])
            context = data.sequences[row, : PROMPT + k * BLOCK]  # [L]
            for block, logits in [(state[b], on_state[b]), (fixed[b], on_fixed[b])]:
                alone = model(input_ids=torch.cat([context, block])[None]).logits[0, len(context) - 1 : -1]  # [n, V]
                assert torch.allclose(logits.double(), alone, atol=1e-5)


def test_training_lowers_the_consistency_loss(cllm_dir: Path, tiny_model_dir: Path) -> None:
    data = load_trajectories(cllm_dir)
    assert data.sequences.shape == data.corpus.shape == (8, PROMPT + BLOCKS * BLOCK)
    assert torch.equal(data.corpus[:, :PROMPT], data.sequences[:, :PROMPT])  # prompts start the corpus windows
    picks = torch.tensor(
        [(e, s) for e, (_, _, _, count) in enumerate(data.blocks.tolist()) for s in range(count - 1)]
    )  # [X, 2] every non-final state
    losses = {}
    for name, path in [("target", tiny_model_dir), ("cllm", cllm_dir)]:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            losses[name] = [loss.item() for loss in cllm_losses(model, data, picks, label_smoothing=0.1)]
    assert losses["cllm"][0] < losses["target"][0]  # consistency
    assert losses["cllm"][1] < losses["target"][1]  # the target's own greedy tokens


def test_saved_folder_loads_with_plain_transformers(cllm_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(cllm_dir)
    tokenizer = AutoTokenizer.from_pretrained(cllm_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == len(tokenizer)
    assert all(t.dtype == torch.float16 for t in load_file(cllm_dir / "model.safetensors").values())
    prompt = tokenizer("import os\n", return_tensors="pt")
    out = model.float().generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape == (1, prompt.input_ids.shape[1] + 5)
    record = json.loads((cllm_dir / "training.json").read_text())
    assert record["steps"] == 6 and record["tokens_seen"] == 6 * 4 * BLOCK and record["prompts"] == 8
    for side in ("target", "cllm"):
        numbers = record["heldout"][side]
        assert numbers["loss_nats"] > 0 and numbers["loss_tokens"] > 0
        assert 1.0 <= numbers["trajectories"]["tokens_per_iteration"] <= BLOCK


def test_interrupted_run_resumes_to_the_uninterrupted_weights(
    cllm_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    args = ["cllm", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_CLLM]
    checkpointed, rerun = killed_then_rerun(main, args, StateSampler, 5, tmp_path, monkeypatch, capsys)
    assert checkpointed == 4
    assert "reusing the trajectories of 8 prompts" in rerun and "resuming from step 4/6" in rerun
    assert same_weights(tmp_path / "model.safetensors", cllm_dir / "model.safetensors")


def test_a_killed_collection_resumes_where_it_stopped(
    cllm_dir: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """Killed in the second batch of four training prompts: the rerun collects only the rest and trains
    to the weights of a run never killed."""
    real_blocks, calls = cllm.jacobi_blocks, []

    def die_in_the_second_batch(*args: object) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        calls.append(1)
        if len(calls) == 2:
            raise Killed
        return real_blocks(*args)

    args = ["cllm", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_CLLM]
    monkeypatch.setattr(cllm, "jacobi_blocks", die_in_the_second_batch)
    with pytest.raises(Killed):
        main(args)
    monkeypatch.undo()
    assert len(load_trajectories(tmp_path).sequences) == 4
    capsys.readouterr()

    assert main(args) == 0
    assert "resuming the collection after 4/8 prompts" in capsys.readouterr().out
    assert torch.equal(load_trajectories(tmp_path).sequences, load_trajectories(cllm_dir).sequences)
    assert same_weights(tmp_path / "model.safetensors", cllm_dir / "model.safetensors")


def test_a_trial_of_corpus_labels_reuses_the_collection(
    cllm_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A trial that changes only the loss starts from a copy of another run's trajectories: it collects
    nothing, and L_AR on the corpus text trains other weights than L_AR on the fixed points."""
    shutil.copytree(cllm_dir / "checkpoint" / DATA_SUBDIR, tmp_path / "checkpoint" / DATA_SUBDIR)
    args = ["cllm", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_CLLM, "loss.ar_labels=corpus"]
    assert main(args) == 0
    assert "reusing the trajectories of 8 prompts" in capsys.readouterr().out
    record = json.loads((tmp_path / "training.json").read_text())
    assert record["config"]["loss.ar_labels"] == "corpus"
    corpus_trained, target_trained = (
        load_file(tmp_path / "model.safetensors"),
        load_file(cllm_dir / "model.safetensors"),
    )
    assert not all(torch.equal(corpus_trained[k], target_trained[k]) for k in target_trained)


def test_trajectories_without_corpus_windows_are_refused(
    cllm_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Trajectories saved before collection kept the corpus windows drew their prompts otherwise: a run
    refuses to resume on them and says what to delete."""
    state = torch.load(cllm_dir / "checkpoint" / DATA_SUBDIR / checkpoint.STATE_FILE, weights_only=True)
    del state["corpus"]
    checkpoint.save_checkpoint(tmp_path / "checkpoint" / DATA_SUBDIR, state)
    assert main(["cllm", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_CLLM]) == 2
    assert f"delete {tmp_path / 'checkpoint'}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.block_size=1", "data.block_size"),
        ("data.blocks=40", "data.blocks"),
        ("data.prompts=0", "data.prompts"),
        ("loss.ar_weight=-1", "loss.ar_weight"),
        ("loss.label_smoothing=1", "loss.label_smoothing"),
        ("loss.ar_labels=gold", "loss.ar_labels"),
        ("eval.seq_len=200", "eval.seq_len"),
        ("train.save_dtype=int8", "train.save_dtype"),
    ],
)
def test_user_errors_name_the_key(
    override: str, key: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["cllm", f"target={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_CLLM, override]) == 2
    assert key in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was collected or written

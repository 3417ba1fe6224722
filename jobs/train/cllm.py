"""`train cllm`: a consistency LLM (CLLM, Kou et al. 2024), the target fine-tuned for Jacobi decoding.

Jacobi decoding (`strategies.proposers.jacobi`) guesses a block of n tokens and refines all of them in
parallel: one iteration runs the model over [context ; guess] and position i takes the model's
greedy choice given the guess's tokens before it. The fixed point is greedy decoding, reached in at
most n iterations; a plain model gains little over one token per iteration, because a token after
a wrong one is usually wrong too. A CLLM learns to jump to the fixed point from any state of the
trajectory, so Jacobi needs fewer iterations for the same (nearly the same model's greedy) output.

Data, as in the paper's `generate_trajectory.py`: prompt windows of the corpus' training split,
decoded block after block by the target with Jacobi from a guess of random prompt tokens, every
state of each block kept (none sampled away: training draws one state per example, as the paper's
trainer does); a block's fixed point joins the context of the next. Collection runs on the lean
forward (`ModelRunner` over a `RaggedKV`), `data.batch_size` prompts' blocks in one forward per
Jacobi iteration. The trajectories are cached in the checkpoint directory under the config's
fingerprint after every batch of prompts, so a killed collection resumes after the last batch it
saved and a resumed training run does not collect again.

The trajectories and their statistics are `cllm_trajectories`; the loss, the paper's, is `cllm_loss`.
Before and after training, the target and the CLLM are measured on held-out text: their loss, and the
statistics of their Jacobi trajectories.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from jobs.train import checkpoint
from jobs.train.cllm_loss import StateSampler, cllm_objective
from jobs.train.cllm_trajectories import Trajectories, stacked, trajectory_statistics
from jobs.train.config_fine_tune import CLLMJobConfig, check_cllm
from jobs.train.corpus import Corpus, load_corpus
from jobs.train.evaluate import heldout_windows, score
from jobs.train.loop import single_phase, train, versions
from jobs.train.model import count_parameters, save_model_dir
from jobs.train.on_target import start_on_target
from jobs.train.sequences import data_fingerprint, draw_prompts
from jobs.train.tokenizer import encode_documents
from pipeline.errors import JobError
from strategies.runtime.runner import ModelRunner

DATA_SUBDIR = "trajectories"  # the collected trajectories, a checkpoint of their own inside the checkpoint directory
_TRAJECTORY_FIELDS = [f.name for f in fields(Trajectories)]


def train_cllm(config: CLLMJobConfig) -> Path:
    """Collect the target's Jacobi trajectories, fine-tune a copy on them; returns the model's directory."""
    started = time.perf_counter()
    run = start_on_target(config, frozen=False)
    model, tokenizer = run.target, run.tokenizer
    out, checkpoint_dir, fingerprint = run.output_dir, run.checkpoint_dir, run.fingerprint
    check_cllm(config, model.config.max_position_embeddings)
    corpus = load_corpus(config.corpus)
    data, collection_s = training_trajectories(config, model, tokenizer, corpus, checkpoint_dir, fingerprint)
    heldout = heldout_set(config, tokenizer, corpus)
    before, target_greedy = measure(model, heldout, config)
    sampler = StateSampler(data.blocks[:, 3], config.train.seed)
    print(
        f"cllm: {count_parameters(model) / 1e6:.2f} M parameters; {len(data.blocks)} blocks of "
        f"{data.block_size} tokens ({len(sampler.blocks)} with a non-final state) from {len(data.sequences)} "
        f"prompts of {corpus.source}; checkpoints in {checkpoint_dir}"
    )
    summary = train(
        model,
        cllm_objective(data, config.loss),
        sampler,
        single_phase(config.train, config.data.block_size),
        config.optim,
        checkpoint_dir,
        {k: v for k, v in fingerprint.items() if not k.startswith("eval.")},  # eval settings do not shape weights
    )
    save_dtype = getattr(torch, config.train.save_dtype)
    model.eval().to(save_dtype).float()  # measure the weights as they are saved
    after, _ = measure(model, heldout, config, target_greedy)
    record = {
        "job": "cllm",
        "config": fingerprint,
        "corpus": corpus.source,
        "prompts": len(data.sequences),
        "blocks": len(data.blocks),
        "trainable_blocks": len(sampler.blocks),
        "states": len(data.states),
        "fixed_point_tokens": len(data.blocks) * data.block_size,
        "collection_wall_s": collection_s,
        "parameters": count_parameters(model),
        **asdict(summary),
        "heldout": {"target": before, "cllm": after},
        "run_wall_s": round(time.perf_counter() - started, 1),  # this run, start to end (measurements included)
        **versions(),
    }
    # Cast before saving: the tied embeddings stay one tensor (a cast of each key would write two).
    save_model_dir(model.cpu().to(save_dtype), tokenizer, out, config.train.save_dtype, record)
    print(_report(before, after))
    print(
        f"cllm: {summary.steps} steps in {summary.wall_s:.0f} s (+ {collection_s:.0f} s collecting); "
        f"training loss {summary.train_loss:.3f}; saved to {out}"
    )
    return out


def training_trajectories(
    config: CLLMJobConfig,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    corpus: Corpus,
    checkpoint_dir: Path,
    fingerprint: dict[str, Any],
) -> tuple[Trajectories, float]:
    """The training trajectories (cached by a run of the same data settings, or collected and cached now),
    and the seconds their collection took."""
    directory = checkpoint_dir / DATA_SUBDIR
    wanted = data_fingerprint(fingerprint)
    data = config.data
    state = checkpoint.load_checkpoint(directory, wanted)
    done, earlier_s = None, 0.0
    if state is not None:
        if "corpus" not in state:
            raise JobError(
                f"the trajectories in {directory} were collected before collection kept the corpus windows "
                f"(and drew its prompts from them): delete {checkpoint_dir} to collect them and train again"
            )
        done, earlier_s = Trajectories(**{key: state[key] for key in _TRAJECTORY_FIELDS}), state["wall_s"]
        if len(done.sequences) == data.prompts:
            print(f"reusing the trajectories of {len(done.sequences)} prompts in {directory}")
            return done, earlier_s
        print(f"resuming the collection after {len(done.sequences)}/{data.prompts} prompts in {directory}")
    start = time.perf_counter()
    tokens = encode_documents(tokenizer, corpus.train)  # [M]
    # Windows as long as the decoded rows: prompts and the corpus' continuations, whichever labels L_AR
    # reads, so trials of either label on one collection see the same prompts.
    windows = draw_prompts(tokens, data.prompts, data.prompt_tokens + data.blocks * data.block_size, config.train.seed)
    prompts = windows[:, : data.prompt_tokens]  # [N, P]

    def save(partial: Trajectories) -> None:
        partial.corpus = windows[: len(partial.sequences)]
        wall_s = round(earlier_s + time.perf_counter() - start, 1)
        checkpoint.save_checkpoint(directory, {**vars(partial), "wall_s": wall_s, "fingerprint": wanted})

    trajectories = collect_trajectories(
        model,
        prompts,
        data.block_size,
        data.blocks,
        data.batch_size,
        config.train.seed,
        _eos(tokenizer),
        "collect",
        done,
        save,
    )
    trajectories.corpus = windows
    return trajectories, round(earlier_s + time.perf_counter() - start, 1)


def initial_guesses(prompts: torch.Tensor, first_row: int, block_size: int, blocks: int, seed: int) -> torch.Tensor:
    """Each block's initial guess: random tokens of its row's prompt (the paper's choice), [B, K, n] int64.

    Keyed by (seed, global row index), so a row's guesses do not depend on the batch it is collected in.
    """
    picks = [
        np.random.default_rng([seed, first_row + b]).integers(0, prompts.shape[1], size=(blocks, block_size))
        for b in range(len(prompts))
    ]
    index = torch.from_numpy(np.stack(picks)).long()  # [B, K, n]
    return prompts.gather(1, index.flatten(1)).view_as(index)


def collect_trajectories(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    block_size: int,
    blocks: int,
    batch_size: int,
    seed: int,
    eos: frozenset[int],
    desc: str,
    done: Trajectories | None = None,
    save: Callable[[Trajectories], None] | None = None,
) -> Trajectories:
    """Jacobi-decode `blocks` blocks of `block_size` after each prompt of `prompts` [N, P], keeping every state.

    A row's blocks after the first whose fixed point holds a token of `eos` are decoded (the batch
    moves together) but not kept. Resumable: `done` holds the trajectories of the first rows, collected
    earlier, and `save` receives the trajectories of every row so far after each batch. A row's
    trajectories depend only on its prompt, its index and the seed, so where a run stopped does not
    change what it collects.
    """
    runner = ModelRunner(model)
    sequences, states, kept = [], [], []
    if done is not None:
        sequences, states, kept = [done.sequences], [done.states], done.blocks.tolist()
    offset = sum(len(s) for s in states)
    start = sum(len(s) for s in sequences)  # rows collected before
    eos_ids = torch.tensor(sorted(eos), dtype=torch.long)
    with tqdm(total=len(prompts), initial=start, desc=desc, unit="prompt", dynamic_ncols=True, mininterval=1.0) as bar:
        for first_row in range(start, len(prompts), batch_size):
            chunk = prompts[first_row : first_row + batch_size]  # [B, P]
            guesses = initial_guesses(chunk, first_row, block_size, blocks, seed)  # [B, K, n]
            fixed, trajectories = jacobi_blocks(runner, list(chunk), guesses)  # [B, K*n], [K][B] of [count, n]
            sequences.append(torch.cat([chunk, fixed], dim=1))
            ended = torch.isin(fixed.view(len(chunk), blocks, block_size), eos_ids).any(-1)  # [B, K] block holds EOS
            after_eos = (ended.int().cumsum(dim=1) - ended.int()).bool()  # [B, K] an earlier block held EOS
            for k, per_row in enumerate(trajectories):
                for b, row_states in enumerate(per_row):
                    if not after_eos[b, k]:
                        kept.append((first_row + b, k, offset, len(row_states)))
                        states.append(row_states)
                        offset += len(row_states)
            if save is not None:
                save(stacked(sequences, states, kept, prompts.shape[1]))
            bar.update(len(chunk))
    return stacked(sequences, states, kept, prompts.shape[1])


def jacobi_blocks(
    runner: ModelRunner, prompts: list[torch.Tensor], guesses: torch.Tensor
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Jacobi-decode blocks after `prompts` (B rows [P_b], any lengths) from `guesses` [B, K, n], block
    after block, every row's block in one forward per iteration.

    Returns the fixed points [B, K*n] and, per block and row, the states [count, n] from the guess to
    the fixed point (first reached). The contexts sit left-padded in one `RaggedKV`; each iteration
    runs the model over the guesses only and drops their slots again, and the batch iterates until its
    slowest row has converged (a converged row's state repeats, and is recorded once).
    """
    device = runner.device
    n = guesses.shape[2]
    kv = runner.new_kv(len(prompts))
    first = runner.prefill(kv, [p.tolist() for p in prompts]).logits[:, -1].argmax(-1)  # [B] slot 0 of every state
    offsets = torch.arange(n, device=device)  # [n]
    real = torch.ones(len(prompts), n, dtype=torch.bool, device=device)  # [B, n] no padding among guesses
    fixed, trajectories = [], []
    for k in range(guesses.shape[1]):
        y = guesses[:, k].to(device)  # [B, n]
        history = [y]
        context = kv.num_slots
        for _ in range(n + 1):  # n iterations reach the fixed point, one more confirms it
            positions = kv.next_pos[:, None] + offsets[: n - 1]  # [B, n-1]
            logits = runner.forward(kv, y[:, :-1], positions, real[:, :-1]).logits  # [B, n-1, V]
            kv.truncate(context)
            update = torch.cat([first[:, None], logits.argmax(-1)], dim=1)  # [B, n]
            if torch.equal(update, y):
                break
            history.append(update)
            y = update
        steps = torch.stack(history, dim=1).cpu()  # [B, J+1, n]
        reached = (steps == y.cpu()[:, None]).all(-1).int().argmax(-1)  # [B] first state equal to the fixed point
        trajectories.append([steps[b, : int(j) + 1] for b, j in enumerate(reached)])
        fixed.append(y.cpu())
        positions = kv.next_pos[:, None] + offsets  # [B, n]
        logits = runner.forward(kv, y, positions, real, logits_to_keep=1).logits  # [B, 1, V]: the block joins
        first = logits[:, -1].argmax(-1)  # [B]
    return torch.cat(fixed, dim=1), trajectories


@dataclass
class HeldOut:
    """What `measure` runs a model on: prompts of the held-out split and windows of its tokens."""

    prompts: torch.Tensor  # [Q, P] int64
    windows: torch.Tensor  # [W, T+1] int64
    eos: frozenset[int]


def heldout_set(config: CLLMJobConfig, tokenizer: PreTrainedTokenizerBase, corpus: Corpus) -> HeldOut:
    """The held-out prompts and loss windows named by `config.eval` (either may be empty)."""
    evaluation = config.eval
    empty = torch.zeros(0, 0, dtype=torch.long)
    if not (evaluation.prompts or evaluation.heldout_tokens):
        return HeldOut(empty, empty, _eos(tokenizer))
    if not corpus.heldout:
        raise JobError(f"corpus {corpus.source} has no held-out documents; raise corpus.heldout_percent")
    tokens = encode_documents(tokenizer, corpus.heldout)  # [M]
    prompts = empty
    if evaluation.prompts:
        prompts = draw_prompts(tokens, evaluation.prompts, config.data.prompt_tokens, config.train.seed)
    windows = empty
    if evaluation.heldout_tokens:
        windows = heldout_windows(tokens, evaluation.seq_len, evaluation.heldout_tokens)
    return HeldOut(prompts, windows, _eos(tokenizer))


def measure(
    model: torch.nn.Module, heldout: HeldOut, config: CLLMJobConfig, reference: torch.Tensor | None = None
) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Held-out loss (nats/token) and Jacobi trajectory statistics of `model`; empty parts are skipped.

    Also returns the model's greedy token at each loss position [W, T]; given another model's
    (`reference`), the share of positions where both agree is reported: what fine-tuning changed of
    the greedy output the CLLM decodes.
    """
    model.eval()
    numbers: dict[str, Any] = {}
    greedy = None
    if heldout.windows.numel():
        loss, greedy = score(model, heldout.windows, config.eval.batch_size)  # [W, T] greedy tokens
        numbers |= {"loss_nats": round(loss, 4), "loss_tokens": heldout.windows[:, 1:].numel()}
        if reference is not None:
            numbers["greedy_agreement_with_target"] = round((greedy == reference).float().mean().item(), 4)
    if heldout.prompts.numel():
        data = config.data
        trajectories = collect_trajectories(
            model,
            heldout.prompts,
            data.block_size,
            data.blocks,
            data.batch_size,
            config.train.seed,
            heldout.eos,
            "held-out",
        )
        numbers["trajectories"] = trajectory_statistics(trajectories)
    return numbers, greedy


def _report(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A table of the held-out numbers of the target and the CLLM."""
    lines = [f"{'':>26}  {'target':>8}  {'cllm':>8}"]
    if "loss_nats" in before:
        lines.append(f"{'held-out loss (nats/token)':>26}  {before['loss_nats']:>8.4f}  {after['loss_nats']:>8.4f}")
        lines.append(f"{'greedy agreement':>26}  {1:>8.4f}  {after['greedy_agreement_with_target']:>8.4f}")
    for key in before.get("trajectories", {}):
        lines.append(f"{key:>26}  {before['trajectories'][key]:>8}  {after['trajectories'][key]:>8}")
    return "\n".join(lines)


def _eos(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    return frozenset() if tokenizer.eos_token_id is None else frozenset({tokenizer.eos_token_id})

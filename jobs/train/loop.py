"""The one training loop of the model jobs: AdamW, warm-up + cosine schedule, checkpoints, progress, export.

A job (`lm`, `draft`) brings a model, an objective and a token stream; this module owns
everything else, so resumption and determinism are implemented once. A step's batch is a pure
function of (seed, step) (`samplers.py`), and the checkpoint holds model, optimizer and RNG state,
so an interrupted run that is re-run ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from jobs.train import checkpoint
from jobs.train.config import LoopConfig, OptimConfig, TrainConfig
from jobs.train.model import count_parameters, save_model_dir
from jobs.train.samplers import WindowSampler

# (model, windows [B, T+1] int64) -> scalar loss; runs under the loop's autocast.
Objective = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]

_LOSS_EMA = 0.95  # smoothing of the loss shown in the progress bar and recorded at the end


@dataclass
class TrainSummary:
    steps: int
    tokens_seen: int  # training tokens over all runs (predictions made)
    wall_s: float  # training wall time summed over all runs, checkpoints included
    train_loss: float  # smoothed training loss at the last step
    device: str


def pick_device(name: str) -> torch.device:
    """`auto`: cuda when available (with deterministic kernels), else cpu."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return device


def use_device(name: str, threads: int) -> torch.device:
    """torch's intra-op threads set to `threads` (0: torch's default), then the device `name` picks."""
    if threads > 0:
        torch.set_num_threads(threads)
    return pick_device(name)


def single_phase(settings: LoopConfig, seq_len: int) -> TrainConfig:
    """The loop's settings for a job trained in one phase of `seq_len`-token rows (heads, exits, cllm):
    `settings` is the job's own train section, which has no phases to configure."""
    shared = {f.name: getattr(settings, f.name) for f in fields(LoopConfig)}
    return TrainConfig(**shared, seq_len=seq_len, final_fraction=0.0)


def lr_at(step: int, steps: int, optim: OptimConfig) -> float:
    """Linear warm-up to `optim.lr`, then cosine decay to `optim.lr * optim.min_lr_ratio` at `steps`."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    progress = (step - optim.warmup_steps) / max(1, steps - optim.warmup_steps)
    floor = optim.lr * optim.min_lr_ratio
    return floor + (optim.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train(
    model: torch.nn.Module,
    objective: Objective,
    sampler: WindowSampler,
    config: TrainConfig,
    optim: OptimConfig,
    checkpoint_dir: Path,
    fingerprint: dict[str, Any],
) -> TrainSummary:
    """Train `model` in place for `config.steps` steps, resuming from `checkpoint_dir` when it holds a state."""
    device = use_device(config.device, config.threads)
    model.to(device).train()
    optimizer = _adamw(model, optim)
    first_step, wall_before, loss_ema = 0, 0.0, float("nan")
    state = checkpoint.load_checkpoint(checkpoint_dir, fingerprint)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        _set_rng(state["rng"])
        first_step, wall_before, loss_ema = state["step"], state["wall_s"], state["loss_ema"]
        print(f"resuming from step {first_step}/{config.steps} (checkpoint {checkpoint_dir})")
    step = first_step
    tokens_per_step = config.batch_size * config.seq_len
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "bfloat16")
    run_start = time.perf_counter()
    bar = tqdm(total=config.steps, initial=first_step, desc="train", dynamic_ncols=True, mininterval=1.0)
    while step < config.steps:
        lr = lr_at(step, config.steps, optim)
        for group in optimizer.param_groups:
            group["lr"] = lr
        windows = sampler.batch(step, config).to(device)  # [B, T+1]
        with autocast:
            loss = objective(model, windows)
        loss.backward()
        if optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        value = loss.item()
        loss_ema = value if math.isnan(loss_ema) else _LOSS_EMA * loss_ema + (1 - _LOSS_EMA) * value
        elapsed = time.perf_counter() - run_start
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{(step - first_step) * tokens_per_step / elapsed:.0f}")
        bar.update()
        if step % config.checkpoint_every == 0 or step == config.steps:
            wall_s = wall_before + time.perf_counter() - run_start
            progress = {"step": step, "wall_s": wall_s, "loss_ema": loss_ema}
            _save_state(checkpoint_dir, progress, model, optimizer, fingerprint)
    bar.close()
    wall_s = wall_before + time.perf_counter() - run_start
    return TrainSummary(step, step * tokens_per_step, round(wall_s, 1), round(loss_ema, 4), str(device))


def train_and_export(
    job: str,
    config: Any,
    model: LlamaForCausalLM,
    objective: Objective,
    tokens: torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    corpus_source: str,
    trained_on: dict[str, str] | None = None,
) -> Path:
    """Train `model` on `tokens` ([N] int32) as `config` (an LM or draft job config) says, then write its dir.

    The model directory gets a training.json recording what produced it: the config, the corpus,
    parameter count, steps, tokens seen, wall time and the library versions. `trained_on` names what
    else determined the weights besides the config (a draft: the target's weights hash); it joins the
    checkpoint's fingerprint, so a run does not resume on a checkpoint distilled from another target.
    """
    out = Path(config.output_dir)
    checkpoint_dir = Path(config.train.checkpoint_dir or out / "checkpoint")
    print(
        f"{job}: {count_parameters(model) / 1e6:.2f} M parameters; {len(tokens) / 1e6:.2f} M training tokens "
        f"from {corpus_source}; checkpoints in {checkpoint_dir}"
    )
    fingerprint = checkpoint.fingerprint(config) | (trained_on or {})
    summary = train(
        model,
        objective,
        WindowSampler(tokens, config.train.seed),
        config.train,
        config.optim,
        checkpoint_dir,
        fingerprint,
    )
    record = {
        "job": job,
        "config": fingerprint,
        "corpus": corpus_source,
        "corpus_train_tokens": len(tokens),
        "parameters": count_parameters(model),
        **asdict(summary),
        **versions(),
    }
    save_model_dir(model.cpu(), tokenizer, out, config.train.save_dtype, record)
    print(
        f"{job}: {summary.steps} steps, {summary.tokens_seen / 1e6:.2f} M tokens in {summary.wall_s:.0f} s; "
        f"training loss {summary.train_loss:.3f}; saved to {out}"
    )
    return out


def versions() -> dict[str, str]:
    """The library versions a training record names."""
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def _adamw(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: decaying norm gains would only shrink them towards 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2))


def _save_state(
    directory: Path,
    progress: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    fingerprint: dict[str, Any],
) -> None:
    """Checkpoint what resuming needs: `progress` (step, wall time, smoothed loss), the model, optimizer and
    RNG states, and the fingerprint a resumed run must match."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": _get_rng()}
    checkpoint.save_checkpoint(directory, {**progress, **state, "fingerprint": fingerprint})


def _get_rng() -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])

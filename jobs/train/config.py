"""Typed configs of the training jobs: one dataclass per job, every field with its help text.

The same config system as `accelgen generate` (`pipeline.config`): YAML plus `key=value` overrides,
checked before any work, and `--help` generated from the field metadata. This module holds the
sections every job shares (corpus, model shape, optimizer, the train section of the loop) and the jobs
that build the model family from scratch; `config_heads` and `config_fine_tune` hold the jobs that
start from a trained target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.errors import JobError
from strategies.config_option import option

PRECISIONS = ("float32", "bfloat16")
SAVE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class CorpusConfig:
    url: str = option(
        "",
        "Training text: a directory, a glob of text files, or a Parquet file/glob; any fsspec URL. "
        "Empty: the Python standard library sources of the running interpreter.",
    )
    include: list[str] = option(["*.py"], "File-name patterns taken when url is a directory (or empty).")
    exclude_dirs: list[str] = option(
        ["site-packages", "test", "tests", "idle_test", "encodings"],
        "Files under a directory of one of these names are skipped (third-party code, test data, codec tables).",
    )
    text_column: str = option("text", "Column holding the text when the corpus is Parquet.")
    heldout_percent: float = option(
        5.0, "Share of files (by a hash of their relative path) held out of training, for evaluation."
    )
    max_files: int = option(0, "Use only the first N files in path order (quick trial runs). 0: all.")
    storage_options: dict[str, Any] = option({}, "fsspec storage options for the corpus URL.")


@dataclass
class LlamaShape:
    hidden_size: int = option(256, "Width of the residual stream.")
    intermediate_size: int = option(768, "Width of the SwiGLU MLP.")
    num_hidden_layers: int = option(6, "Transformer blocks.")
    num_attention_heads: int = option(4, "Query heads; head_dim = hidden_size / num_attention_heads.")
    num_key_value_heads: int = option(2, "Key/value heads (grouped-query attention when fewer than query heads).")
    max_position_embeddings: int = option(1024, "Context length the model advertises and is trained to reach.")
    rope_theta: float = option(10000.0, "RoPE base frequency.")


@dataclass
class OptimConfig:
    lr: float = option(2e-3, "Peak learning rate of AdamW.")
    min_lr_ratio: float = option(0.1, "The cosine schedule ends at lr * min_lr_ratio.")
    warmup_steps: int = option(100, "Steps of linear warm-up from 0 to lr.")
    weight_decay: float = option(0.1, "AdamW weight decay, applied to matrices (not to norms).")
    beta1: float = option(0.9, "AdamW beta1.")
    beta2: float = option(0.95, "AdamW beta2.")
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value. 0: no clipping.")


@dataclass
class StepsConfig:
    """The first fields of every train section: how many steps, how much each one sees."""

    steps: int = option(1000, "Optimizer steps.")
    batch_size: int = option(8, "Examples per step.")


@dataclass
class LoopConfig(StepsConfig):
    """The train section every trainer shares: how `loop.train` runs. A trainer's own section extends it,
    restating a field only where its default or its meaning there differs.

    A section with fields of its own about its steps (window lengths) also extends a `StepsConfig` of
    them, listed last among its bases: dataclasses order fields from the last base to the first, so
    those fields stand beside steps and batch_size, not after the checkpoints.
    """

    seed: int = option(0, "Seed of prompt sampling and of every random choice of the examples.")
    precision: str = option(
        "float32",
        f"One of {PRECISIONS}: autocast dtype of forward/backward. bfloat16 only pays on GPUs (or CPUs with "
        "bfloat16 matmuls).",
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    checkpoint_every: int = option(100, "Save the resumable training state every this many steps.")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state goes; re-running the same command resumes from it. Empty: <output_dir>/checkpoint.",
    )


@dataclass
class ExportingLoopConfig(LoopConfig):
    """The train section of a trainer that exports a Hugging Face model."""

    save_dtype: str = option("float32", f"One of {SAVE_DTYPES}: dtype of the exported model.safetensors.")


def check_loop(train: LoopConfig, *sizes: str) -> None:
    """The checks of every train section: a known precision (and save dtype), and steps, batch_size, the
    section's `sizes` and checkpoint_every at least 1."""
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if isinstance(train, ExportingLoopConfig) and train.save_dtype not in SAVE_DTYPES:
        raise JobError(f"train.save_dtype={train.save_dtype!r}: use one of {SAVE_DTYPES}")
    keys = ["steps", "batch_size", *sizes, "checkpoint_every"]
    if min(getattr(train, key) for key in keys) < 1:
        raise JobError(f"{', '.join(f'train.{key}' for key in keys[:-1])} and train.{keys[-1]} must be >= 1")


@dataclass
class WindowsConfig(StepsConfig):
    """The windows of a model trained from scratch: short ones first, then its whole context."""

    seq_len: int = option(256, "Window length (tokens) of the first phase: short windows see more tokens per second.")
    final_seq_len: int = option(
        1024,
        "Window length of the last phase, so the model learns every position up to its context; the "
        "batch shrinks to keep tokens per step. Must divide batch_size * seq_len.",
    )
    final_fraction: float = option(0.2, "Share of the steps trained on final_seq_len windows (at the end). 0: none.")


@dataclass
class TrainConfig(ExportingLoopConfig, WindowsConfig):
    """The train section of `lm` and `draft`, and what the loop runs on (`loop.single_phase`)."""

    batch_size: int = option(16, "Windows per step in the first phase; tokens per step = batch_size * seq_len.")
    seed: int = option(0, "Seed of initialization and window order; same seed, corpus and hardware: same weights.")
    precision: str = option(
        "bfloat16", f"One of {PRECISIONS}: autocast dtype of forward/backward (weights stay float32)."
    )


@dataclass
class TokenizerJobConfig:
    output_dir: str = option(MISSING, "Directory receiving tokenizer.json and tokenizer_config.json.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab_size: int = option(8192, "Vocabulary size including the special tokens.")
    min_frequency: int = option(2, "A pair must occur at least this often to be merged.")


@dataclass
class LMJobConfig:
    tokenizer: str = option(MISSING, "Tokenizer directory written by `train tokenizer`.")
    output_dir: str = option(MISSING, "Directory receiving the Hugging Face model (and the tokenizer).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: LlamaShape = field(default_factory=LlamaShape)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class DistillConfig:
    kl_weight: float = option(1.0, "Weight of KL(target || draft) on next-token distributions.")
    ce_weight: float = option(0.0, "Weight of the cross-entropy on the corpus' next tokens.")
    temperature: float = option(1.0, "Both distributions are softened by this temperature; the KL is scaled by T².")


@dataclass
class DraftJobConfig:
    target: str = option(MISSING, "Target model directory (written by `train lm`); its tokenizer is reused.")
    output_dir: str = option(MISSING, "Directory receiving the draft model (and the tokenizer).")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: LlamaShape = field(
        default_factory=lambda: LlamaShape(
            hidden_size=128, intermediate_size=384, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
        )
    )
    init_layers: list[int] = option(
        [],
        "Target layers (0-based, in order) the draft's layers start from, with the target's embeddings and final "
        "norm: the draft must then have the target's shape but for its layer count. Empty: a random start.",
    )
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class EvalJobConfig:
    model: str = option(MISSING, "Model directory to evaluate (it holds its tokenizer).")
    draft: str = option("", "Draft model directory: adds its loss, greedy agreement with the model and its speed.")
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    seq_len: int = option(1024, "Window length of the held-out loss.")
    max_tokens: int = option(200_000, "Held-out tokens evaluated at most.")
    batch_size: int = option(4, "Windows per forward pass.")
    decode_tokens: int = option(128, "Tokens generated at batch 1 to measure decode speed. 0: skip.")
    prompt_tokens: int = option(64, "Prompt length (held-out tokens) of the decode-speed measurement.")
    device: str = option("cpu", "Device of the evaluation; decode speed is reported for this device.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    report: str = option("", "Also write the numbers as JSON to this path.")


def check_train(train: TrainConfig, shape: LlamaShape) -> None:
    """Value checks the types cannot express, before any corpus is read or model built."""
    check_loop(train, "seq_len")
    if not 0.0 <= train.final_fraction < 1.0:
        raise JobError(f"train.final_fraction={train.final_fraction}: use a value in [0, 1)")
    longest = max(train.seq_len, train.final_seq_len if train.final_fraction > 0 else 0)
    if longest > shape.max_position_embeddings:
        raise JobError(
            f"windows of {longest} tokens exceed model.max_position_embeddings={shape.max_position_embeddings}: "
            "shorten train.seq_len / train.final_seq_len or raise the context"
        )
    if train.final_fraction > 0 and (train.batch_size * train.seq_len) % train.final_seq_len:
        raise JobError(
            f"train.final_seq_len={train.final_seq_len} must divide train.batch_size * train.seq_len = "
            f"{train.batch_size * train.seq_len} (tokens per step stay constant across phases)"
        )
    if shape.hidden_size % shape.num_attention_heads or shape.num_attention_heads % shape.num_key_value_heads:
        raise JobError(
            f"model.hidden_size={shape.hidden_size} must be a multiple of model.num_attention_heads="
            f"{shape.num_attention_heads}, itself a multiple of model.num_key_value_heads={shape.num_key_value_heads}"
        )

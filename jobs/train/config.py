"""Typed configs of the training jobs: one dataclass per job, every field with its help text.

The same config system as `accelgen generate` (`pipeline.config`): YAML plus `key=value` overrides,
checked before any work, and `--help` generated from the field metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from pipeline.config import option
from pipeline.errors import JobError

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
class TrainConfig:
    steps: int = option(1000, "Optimizer steps.")
    batch_size: int = option(16, "Windows per step in the first phase; tokens per step = batch_size * seq_len.")
    seq_len: int = option(256, "Window length (tokens) of the first phase: short windows see more tokens per second.")
    final_seq_len: int = option(
        1024,
        "Window length of the last phase, so the model learns every position up to its context; the "
        "batch shrinks to keep tokens per step. Must divide batch_size * seq_len.",
    )
    final_fraction: float = option(0.2, "Share of the steps trained on final_seq_len windows (at the end). 0: none.")
    seed: int = option(0, "Seed of initialization and window order; same seed, corpus and hardware: same weights.")
    precision: str = option(
        "bfloat16", f"One of {PRECISIONS}: autocast dtype of forward/backward (weights stay float32)."
    )
    device: str = option("auto", "auto: cuda when available, else cpu. Or any torch device string.")
    threads: int = option(0, "torch intra-op threads. 0: torch's default (all cores).")
    checkpoint_every: int = option(100, "Save the resumable training state every this many steps.")
    checkpoint_dir: str = option(
        "",
        "Where the resumable state goes; re-running the same command resumes from it. Empty: <output_dir>/checkpoint.",
    )
    save_dtype: str = option("float32", f"One of {SAVE_DTYPES}: dtype of the exported model.safetensors.")


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
    if train.precision not in PRECISIONS:
        raise JobError(f"train.precision={train.precision!r}: use one of {PRECISIONS}")
    if train.save_dtype not in SAVE_DTYPES:
        raise JobError(f"train.save_dtype={train.save_dtype!r}: use one of {SAVE_DTYPES}")
    if min(train.steps, train.batch_size, train.seq_len, train.checkpoint_every) < 1:
        raise JobError("train.steps, train.batch_size, train.seq_len and train.checkpoint_every must be >= 1")
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

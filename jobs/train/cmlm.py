"""`train cmlm`: a conditional masked LM (Mask-Predict's CMLM) distilled from the target.

Model (`strategies.artifacts.cmlm`): a Llama of the target's width, its first `shape.layers` blocks, embeddings
and final norm copied from the target, over the target's tokenizer plus `<mask>`, `<length>` and
`<len_1>` … `<len_L>`; the block after the context attends both ways.

Data, sequence-level distillation as in the paper: windows of the corpus' training split, each
continued greedily by the target (stopping at EOS), so the CMLM learns this target's output, not the
raw corpus. Continuations are collected once and cached in the checkpoint directory. An example is a
random split point j of one continuation: the context is the tokens before it (a uniform length of
them), the block the next up-to-L tokens; its length is the tokens up to and including an EOS, at most
L (a continuation cut short without EOS only offers split points with a full block after them).
A share of examples shortens the block (`data.short_block_share`): a drafter fills short blocks.

Loss, the paper's: uniform masking (a uniform count 1 … N of the block's tokens, at random
positions), the cross-entropy of the masked tokens, plus `length_weight` times the cross-entropy
of the length at the LENGTH marker. Examples are a pure function of (seed, step), so a resumed run
trains on the batches an uninterrupted one would.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from jobs.train.config import TrainConfig
from jobs.train.config_fine_tune import CMLMJobConfig, check_cmlm
from jobs.train.corpus import Document, load_corpus
from jobs.train.loop import Objective, single_phase, train, versions
from jobs.train.model import count_parameters, save_model_dir
from jobs.train.on_target import start_on_target
from jobs.train.sequences import cached_sequences, continue_greedily, data_fingerprint, draw_prompts
from jobs.train.tokenizer import encode_documents
from pipeline.errors import JobError
from strategies.artifacts.cmlm import CMLM, LENGTH_TOKEN, MASK_TOKEN, CMLMConfig, length_token, write_config
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.mask_predict import MaskPredictStrategy
from strategies.methods.mask_predict import MaskPredictOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

DATA_SUBDIR = "continuations"  # the collected continuations: a checkpoint of their own


def train_cmlm(config: CMLMJobConfig) -> Path:
    """Collect the target's greedy continuations, train a CMLM on them; returns the model's directory."""
    started = time.perf_counter()
    run = start_on_target(config, frozen=True)
    target, tokenizer = run.target, run.tokenizer
    out, checkpoint_dir, fingerprint = run.output_dir, run.checkpoint_dir, run.fingerprint
    check_cmlm(config, target.config.num_hidden_layers, target.config.max_position_embeddings)
    corpus = load_corpus(config.corpus)
    data, collection_s = continuations(config, target, tokenizer, corpus.train, checkpoint_dir, fingerprint)
    cmlm_tokenizer, spec = cmlm_tokenizer_and_config(tokenizer, config.shape.max_length)
    model = cmlm_from_target(target, config.shape.layers, len(cmlm_tokenizer), config.train.seed)
    heldout = heldout_prompts(config, tokenizer, corpus.heldout, target)
    before = agreement(model, spec, heldout, config)
    print(
        f"cmlm: {count_parameters(model) / 1e6:.2f} M parameters ({config.shape.layers} of the target's "
        f"{target.config.num_hidden_layers} layers); {len(data.sequences)} continuations of {corpus.source}; "
        f"checkpoints in {checkpoint_dir}"
    )
    sampler = ExampleSampler(data, config)
    summary = train(
        model,
        cmlm_objective(data, spec, config.train.length_weight, config.train.seed),
        sampler,
        single_phase(config.train, config.data.prompt_tokens + 2 + config.shape.max_length),
        config.optim,
        checkpoint_dir,
        {k: v for k, v in fingerprint.items() if not k.startswith("eval.")},  # eval settings do not shape weights
    )
    save_dtype = getattr(torch, config.train.save_dtype)
    model.eval().to(save_dtype).float()  # measure the weights as they are saved
    after = agreement(model, spec, heldout, config)
    spec.target_path = config.target
    spec.target_weights_sha256 = fingerprint["target_weights_sha256"]
    record = {
        "job": "cmlm",
        "config": fingerprint,
        "corpus": corpus.source,
        "continuations": len(data.sequences),
        "continuation_tokens": int(data.lengths.sum()),
        "collection_wall_s": collection_s,
        "parameters": count_parameters(model),
        **asdict(summary),
        "heldout_agreement": {"before": before, "after": after},
        "run_wall_s": round(time.perf_counter() - started, 1),
        **versions(),
    }
    spec.training = {k: record[k] for k in ("job", "steps", "wall_s", "train_loss", "heldout_agreement")}
    save_model_dir(model.cpu().to(save_dtype), cmlm_tokenizer, out, config.train.save_dtype, record)
    write_config(out, spec)
    print(_report(before, after))
    print(
        f"cmlm: {summary.steps} steps in {summary.wall_s:.0f} s (+ {collection_s:.0f} s collecting); "
        f"training loss {summary.train_loss:.3f}; saved to {out}"
    )
    return out


@dataclass
class Continuations:
    """The target's greedy continuations of prompt windows, each up to its first EOS."""

    sequences: torch.Tensor  # [N, P + C] each prompt, then the target's C greedy tokens (EOS ignored)
    lengths: torch.Tensor  # [N] tokens of each continuation up to and including its first EOS (else C)
    ended: torch.Tensor  # [N] bool: the continuation holds an EOS (else it was cut at C tokens)
    prompt_tokens: int


def ends_at_eos(sequences: torch.Tensor, prompt_tokens: int, eos_id: int) -> Continuations:
    """`sequences` [N, P + C] (greedy continuations past EOS: the tokens before an EOS are the same as a
    run that stopped there) read as continuations that end at their first EOS."""
    tail = sequences[:, prompt_tokens:].long()  # [N, C]
    is_eos = tail == eos_id
    ended = is_eos.any(dim=1)
    lengths = torch.where(
        ended, is_eos.int().argmax(dim=1) + 1, torch.full_like(ended, tail.shape[1], dtype=torch.long)
    )
    return Continuations(sequences.long(), lengths, ended, prompt_tokens)


def continuations(
    config: CMLMJobConfig,
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    checkpoint_dir: Path,
    fingerprint: dict[str, Any],
) -> tuple[Continuations, float]:
    """The distillation data (cached by a run of the same data settings, or collected and cached now), and
    the seconds its collection took."""
    data = config.data

    def generate() -> torch.Tensor:
        tokens = encode_documents(tokenizer, documents)
        prompts = draw_prompts(tokens, data.prompts, data.prompt_tokens, config.train.seed)  # [N, P]
        return continue_greedily(target, prompts, data.continuation, data.batch_size, "collect")

    sequences, wall_s = cached_sequences(checkpoint_dir / DATA_SUBDIR, data_fingerprint(fingerprint), generate)
    return ends_at_eos(sequences, data.prompt_tokens, tokenizer.eos_token_id), wall_s


def cmlm_tokenizer_and_config(
    tokenizer: PreTrainedTokenizerBase, max_length: int
) -> tuple[PreTrainedTokenizerBase, CMLMConfig]:
    """A copy of the target's tokenizer with the CMLM's tokens added after its vocabulary, and their ids."""
    extended = copy.deepcopy(tokenizer)
    content = len(tokenizer)
    added = [MASK_TOKEN, LENGTH_TOKEN, *(length_token(n) for n in range(1, max_length + 1))]
    extended.add_tokens(added, special_tokens=True)
    ids = extended.convert_tokens_to_ids(added)
    if ids != list(range(content, content + len(added))):
        raise JobError(f"the tokenizer gave the CMLM's tokens ids {ids[:3]}…, not the ids after its vocabulary")
    return extended, CMLMConfig(
        content_vocab_size=content,
        mask_token_id=content,
        length_token_id=content + 1,
        first_length_token_id=content + 2,
        max_length=max_length,
    )


def cmlm_from_target(target: torch.nn.Module, layers: int, vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A float32 Llama of the target's shape with its first `layers` blocks, embeddings (extended to
    `vocab_size`: the new rows start at the mean embedding) and final norm, copied."""
    shape = target.config.to_dict()
    shape.update(num_hidden_layers=layers, vocab_size=vocab_size, tie_word_embeddings=True)
    for key in ("architectures", "dtype", "torch_dtype", "transformers_version"):
        shape.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig(**shape))
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or _layer(k) < layers}
    embeddings = state.pop("model.embed_tokens.weight")  # [V, H]
    state.pop("lm_head.weight", None)  # tied
    extended = embeddings.mean(dim=0, keepdim=True).repeat(vocab_size, 1)  # [V', H]
    extended[: len(embeddings)] = embeddings
    noise = torch.Generator().manual_seed(seed)  # not the global stream: the result may not depend on what ran before
    extended[len(embeddings) :] += 0.02 * torch.randn(
        vocab_size - len(embeddings), embeddings.shape[1], generator=noise
    )
    state["model.embed_tokens.weight"] = extended
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise JobError(f"the target's weights do not fit a Llama CMLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


def _layer(key: str) -> int:
    return int(key.split(".")[2])


class ExampleSampler:
    """Batches of examples [B, 6] int64: (continuation, split point, context length, block size, length, index).

    Each example is drawn from a generator keyed by (seed, example index): a pure function of
    (seed, step), so a resumed run sees the batches an uninterrupted one would.
    """

    def __init__(self, data: Continuations, config: CMLMJobConfig) -> None:
        self.data = data
        self.max_length = config.shape.max_length
        self.min_context = config.data.min_context
        self.short_share = config.data.short_block_share
        self.seed = config.train.seed
        # Split points with a known block after them: any before the end of a continuation that ended
        # with EOS; for one cut short, those with a full block after them.
        self.last_split = torch.where(data.ended, data.lengths - 1, data.lengths - self.max_length)  # [N]
        self.usable = torch.nonzero(self.last_split >= 0).flatten()
        if not len(self.usable):
            raise JobError("no continuation holds a full block: raise data.continuation")

    def batch(self, step: int, config: TrainConfig) -> torch.Tensor:
        examples = []
        for index in range(step * config.batch_size, (step + 1) * config.batch_size):
            rng = np.random.default_rng([self.seed, index])
            row = int(self.usable[rng.integers(len(self.usable))])
            split = int(rng.integers(int(self.last_split[row]) + 1))
            length = min(self.max_length, int(self.data.lengths[row]) - split)
            available = self.data.prompt_tokens + split
            context = int(rng.integers(min(self.min_context, available), available + 1))
            size = int(rng.integers(1, length + 1)) if rng.random() < self.short_share else length
            examples.append((row, split, context, size, length, index))
        return torch.tensor(examples, dtype=torch.long)


def masked_batch(
    data: Continuations, spec: CMLMConfig, examples: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs [B, T] `[context ; LENGTH ; <len_N> ; block with masks]` (right-padded), their attention
    [B, T, T] (causal, the block both ways), the LENGTH marker's index [B], the masked positions' indices
    and their true tokens (each [M], flattened over the batch as row * T + column)."""
    widths = examples[:, 2] + 2 + examples[:, 3]
    width = int(widths.max())
    inputs = torch.full((len(examples), width), spec.mask_token_id, dtype=torch.long)
    allowed = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(examples), 1, 1)
    marker = torch.zeros(len(examples), dtype=torch.long)
    where, truth = [], []
    p = data.prompt_tokens
    for b, (row, split, context, size, _, index) in enumerate(examples.tolist()):
        sequence = data.sequences[row]
        inputs[b, :context] = sequence[p + split - context : p + split]
        inputs[b, context] = spec.length_token_id
        inputs[b, context + 1] = spec.length_id(size)
        block = sequence[p + split : p + split + size]
        rng = np.random.default_rng([seed, 2, index])
        masked = rng.permutation(size)[: int(rng.integers(1, size + 1))]
        first = context + 2
        inputs[b, first : first + size] = block
        inputs[b, first + masked] = spec.mask_token_id
        allowed[b, context + 1 : context + 2 + size, context + 1 : context + 2 + size] = True
        marker[b] = b * width + context
        where.append(b * width + first + torch.from_numpy(np.sort(masked)))
        truth.append(block[np.sort(masked)])
    return inputs, allowed, marker, torch.cat(where), torch.cat(truth)


def cmlm_objective(data: Continuations, spec: CMLMConfig, length_weight: float, seed: int) -> Objective:
    """Cross-entropy of the masked tokens + `length_weight` × that of the length at the LENGTH marker."""

    def objective(model: torch.nn.Module, examples: torch.Tensor) -> torch.Tensor:
        examples = examples.cpu()
        inputs, allowed, marker, where, truth = masked_batch(data, spec, examples, seed)
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        hidden = model.get_decoder()(input_ids=inputs.to(device), attention_mask=mask[:, None].to(device))
        states = hidden.last_hidden_state.flatten(0, 1)  # [B*T, H]
        head = model.get_output_embeddings()
        tokens = head(states[where.to(device)]).float()[:, : spec.content_vocab_size]  # [M, V]
        token_loss = F.cross_entropy(tokens, truth.to(device))
        first = spec.first_length_token_id
        lengths = head(states[marker.to(device)]).float()[:, first : first + spec.max_length]  # [B, L]
        length_loss = F.cross_entropy(lengths, (examples[:, 4] - 1).to(device))
        return token_loss + length_weight * length_loss

    return objective


def heldout_prompts(
    config: CMLMJobConfig, tokenizer: PreTrainedTokenizerBase, documents: list, target: torch.nn.Module
) -> Continuations | None:
    """Held-out prompt windows and the target's greedy continuation of each (one block), or None.

    Agreement is measured with EOS ignored, over the whole block: `lengths` are not used."""
    if not config.eval.prompts:
        return None
    if not documents:
        raise JobError("the corpus has no held-out documents; raise corpus.heldout_percent or set eval.prompts=0")
    tokens = encode_documents(tokenizer, documents)
    prompts = draw_prompts(tokens, config.eval.prompts, config.data.prompt_tokens, config.train.seed)
    block = continue_greedily(target, prompts, config.shape.max_length, config.data.batch_size, "held-out")
    return ends_at_eos(block, config.data.prompt_tokens, tokenizer.eos_token_id)


def agreement(
    model: torch.nn.Module, spec: CMLMConfig, heldout: Continuations | None, config: CMLMJobConfig
) -> dict[str, float]:
    """Per T of `eval.iterations`: the share of block positions where Mask-Predict (one block of the
    target continuation's length, EOS ignored) equals the target's greedy continuation."""
    if heldout is None:
        return {}
    model.eval()
    cmlm = CMLM(ModelRunner(model), spec)
    p = heldout.prompt_tokens
    numbers = {}
    for iterations in config.eval.iterations:
        options = MaskPredictOptions(iterations=iterations)
        strategy = MaskPredictStrategy(cmlm, options)
        same = total = 0
        length = heldout.sequences.shape[1] - p
        params = GenerationParams(length, SamplingParams(), frozenset(), ignore_eos=True)
        for chunk in heldout.sequences.split(config.data.batch_size):
            requests = [RowRequest(row[:p].tolist(), 0) for row in chunk]
            outputs = torch.tensor([out.tokens for out in strategy.generate(requests, params).rows])
            same += int((outputs == chunk[:, p:]).sum())
            total += outputs.numel()
        numbers[f"T={iterations}"] = round(same / max(1, total), 4)
    model.train()
    return numbers


def _report(before: dict[str, float], after: dict[str, float]) -> str:
    lines = [f"{'held-out token agreement':>26}  {'init':>8}  {'cmlm':>8}"]
    lines += [f"{key:>26}  {before[key]:>8.4f}  {after[key]:>8.4f}" for key in before]
    return "\n".join(lines)

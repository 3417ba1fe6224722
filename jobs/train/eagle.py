"""`train eagle`: an EAGLE head (`strategies.artifacts.eagle`) on the frozen target, by self-distillation.

The data is `train heads`' own (`heads.training_sequences`): prompt windows of the corpus' training
split, each continued greedily by the target, generated once and cached in the checkpoint directory.
The target is frozen, so its features (last hidden states after the final norm) are data, computed
once per run in float32.

At each position t the head reads (f_t + noise, x_{t+1}) and predicts f_{t+1}; its inputs in a
sequence form one causal chain, as in decoding. The loss is EAGLE-1's: SmoothL1(f̂_{t+1}, f_{t+1}) +
ce_weight · CE(LM(f̂_{t+1}), softmax(LM(f_{t+1}))), the second against the target's whole distribution.
The noise U(−a, a) on the input features (a = `noise`, 0.1 in the paper) makes the head robust to its
own errors, which it reads back when it drafts further than one token. It is drawn from torch's global
generator, which the loop's checkpoints carry, so a resumed run is bit-identical.

The head's draft vocabulary is the `draft_vocab` tokens most frequent in the corpus' training split
(`jobs.train.draft_vocab`); `draft_vocab_only=true` writes only that, for a head already trained.

The run ends by decoding held-out prompts with the head, chain, static and dynamic tree, and records the
acceptance at each draft depth and τ (tokens per verify step) in `eagle.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from jobs.train import draft_vocab
from jobs.train.config_heads import EagleJobConfig, check_eagle
from jobs.train.corpus import Corpus, Document
from jobs.train.draft_vocab import trained_head, use_draft_vocab
from jobs.train.heads import save_trained, start_on_sequences, train_on_sequences, training_sequences
from jobs.train.loop import Objective
from jobs.train.on_target import TargetRun
from jobs.train.sequences import draw_prompts
from jobs.train.tokenizer import encode_documents
from pipeline.report import acceptance_by_position, tau_by_drafter
from strategies import registry
from strategies.artifacts.configs import EAGLE_KIND, EagleConfig
from strategies.artifacts.eagle import EagleHead, load_eagle
from strategies.base import GenerationParams, RowRequest
from strategies.methods.eagle import EAGLE_TREES
from strategies.options import StrategyOptions
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from workers.common.model_files import weights_sha256


def train_eagle(config: EagleJobConfig) -> Path:
    """Train the head described by `config` on its frozen target; returns the head's directory."""
    on_target, corpus = start_on_sequences(config, check_eagle)
    if config.draft_vocab_only:
        return write_draft_vocab(config, on_target, corpus)
    target, tokenizer = on_target.target, on_target.tokenizer
    run = training_sequences(config, on_target, corpus)
    head = new_head(config, target)
    features = target_features(target, run.sequences, config.data.batch_size)  # [N, L, H]
    loss = eagle_loss(features, run.sequences.long().to(on_target.device), config.noise, config.ce_weight)
    positions = run.sequences.shape[1] - 1  # predictions per sequence
    summary = train_on_sequences("eagle", config, run, head, loss, positions)
    del features, loss
    head.eval()
    vocab = use_draft_vocab(EAGLE_KIND, head, config.draft_vocab, tokenizer, corpus)
    acceptance = heldout_acceptance(head, target, tokenizer, corpus.heldout, config)
    out = save_trained(
        "eagle", config, run, head, summary, {"heldout_acceptance": acceptance, "draft_vocab": vocab.record}
    )
    vocab.save(out)
    return out


def write_draft_vocab(config: EagleJobConfig, on_target: TargetRun, corpus: Corpus) -> Path:
    """`draft_vocab_only`: the draft vocabulary of the head trained in output_dir, and its held-out acceptance
    with it, written to `eagle.json` and `draft_vocab.safetensors`; `eagle.safetensors` is left as it is."""
    target, tokenizer, out = on_target.target, on_target.tokenizer, on_target.output_dir
    device = target.lm_head.weight.device
    head = trained_head(lambda: load_eagle(out, torch.float32, device, draft_vocab=False), out, config.target)
    head.use_target(target)

    def measure() -> dict[str, Any]:
        return {"heldout_acceptance": heldout_acceptance(head, target, tokenizer, corpus.heldout, config)}

    return draft_vocab.write_draft_vocab(EAGLE_KIND, head, out, config.draft_vocab, tokenizer, corpus, measure)


def new_head(config: EagleJobConfig, target: torch.nn.Module) -> EagleHead:
    """An untrained head for `target`, deterministic for train.seed, reading its embedding and LM head."""
    torch.manual_seed(config.train.seed)
    trained_for = {"target_path": config.target, "target_weights_sha256": weights_sha256(Path(config.target))}
    head = EagleHead(EagleConfig.of_target(target, **trained_for))
    head.use_target(target)
    return head.to(target.lm_head.weight.device)


@torch.no_grad()
def target_features(target: torch.nn.Module, sequences: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The target's features (last hidden states after its final norm) at every position: [N, L, H] float32."""
    device = target.lm_head.weight.device
    chunks = sequences.split(batch_size)
    return torch.cat([target.model(input_ids=c.long().to(device)).last_hidden_state.float() for c in chunks])


def eagle_loss(features: torch.Tensor, sequences: torch.Tensor, noise: float, ce_weight: float) -> Objective:
    """The objective of `train` for a batch of sequence indices [B]: SmoothL1 on the predicted features plus
    `ce_weight` times the cross-entropy against the target's distribution at the next position.

    `features` [N, L, H] and `sequences` [N, L] are the whole data set, on the training device.
    """

    def loss(head: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
        f, tokens = features[indices], sequences[indices]  # [B, L, H], [B, L]
        inputs = f[:, :-1] + (torch.rand_like(f[:, :-1]) * 2 - 1) * noise  # [B, L-1, H] f_t + U(-a, a)
        positions = torch.arange(inputs.shape[1], device=f.device).expand(len(indices), -1)  # [B, L-1]
        predicted = head(inputs, tokens[:, 1:], positions)  # [B, L-1, H] f̂_{t+1}
        wanted = f[:, 1:]  # [B, L-1, H]
        regression = F.smooth_l1_loss(predicted.float(), wanted)
        with torch.no_grad():
            target_probs = torch.softmax(head.logits(wanted), dim=-1)  # [B, L-1, V]
        log_probs = torch.log_softmax(head.logits(predicted).float(), dim=-1)
        cross_entropy = -(target_probs * log_probs).sum(-1).mean()
        return regression + ce_weight * cross_entropy

    return loss


@torch.inference_mode()
def heldout_acceptance(
    head: EagleHead,
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    config: EagleJobConfig,
) -> dict[str, Any]:
    """Per tree shape (chain, static, dynamic): acceptance at each draft depth and τ, decoding held-out prompts
    greedily with the head as a job would (no controller); printed."""
    tokens = encode_documents(tokenizer, documents)  # [M]
    prompts = draw_prompts(tokens, config.data.eval_sequences, config.data.prompt_tokens, config.train.seed)
    requests = [RowRequest(prompt=p, key=i) for i, p in enumerate(prompts.tolist())]
    params = GenerationParams(config.eval.new_tokens, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    models = registry.Models(ModelRunner(target), eagle=head)
    size, measured = config.data.batch_size, {}
    for tree in EAGLE_TREES:
        options = StrategyOptions(name="eagle", adaptive=False)
        options.eagle.tree, options.eagle.depth = tree, config.eval.depth
        batches = [  # the summing of per-batch counts is the job report's
            {**registry.create(options, models).generate(requests[i : i + size], params).stats, "strategy": tree}
            for i in range(0, len(requests), size)
        ]
        measured[tree] = {
            "acceptance_by_depth": [round(a, 4) for a in acceptance_by_position(batches)[tree]],
            "tau": round(tau_by_drafter(batches)["eagle"], 4),
        }
        print(f"eagle {tree}: tau {measured[tree]['tau']}, acceptance by depth {measured[tree]['acceptance_by_depth']}")
    return measured

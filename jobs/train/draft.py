"""`train draft`: a much smaller Llama over the target's tokenizer, distilled from the target.

The draft is trained to match the target's next-token distribution, KL(target || draft), not the
corpus: what speculative decoding rewards is agreeing with the target, including where the target
is wrong. Cross-entropy on the corpus can be mixed in (`distill.ce_weight`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from jobs.train.config import DistillConfig, DraftJobConfig, check_train
from jobs.train.corpus import load_corpus
from jobs.train.loop import Objective, pick_device, train_and_export
from jobs.train.model import build_llama
from jobs.train.tokenizer import encode_documents, load_tokenizer
from pipeline.errors import JobError
from workers.common.model_files import weights_sha256


def distillation_loss(target: torch.nn.Module, distill: DistillConfig) -> Objective:
    """The draft's objective: kl_weight·T²·KL(p_target/T || q_draft/T) + ce_weight·CE, per position."""
    temperature = distill.temperature

    def loss(draft: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
        inputs = windows[:, :-1]  # [B, T]
        with torch.no_grad():
            teacher = target(input_ids=inputs).logits.float().flatten(0, 1)  # [B*T, V]
            log_p = F.log_softmax(teacher / temperature, dim=-1)  # [B*T, V]
            p = log_p.exp()  # [B*T, V]
            entropy = -(p * log_p).sum(-1).mean()  # H(p), constant for the draft
        student = draft(input_ids=inputs).logits.float().flatten(0, 1)  # [B*T, V]
        # KL(p || q) = CE(p, q) - H(p); cross_entropy with soft targets is one fused pass and its backward.
        kl = (F.cross_entropy(student / temperature, p) - entropy) * temperature**2
        total = distill.kl_weight * kl
        if distill.ce_weight > 0:
            total = total + distill.ce_weight * F.cross_entropy(student, windows[:, 1:].flatten())
        return total

    return loss


def start_from_target(draft: LlamaForCausalLM, target: LlamaForCausalLM, layers: list[int]) -> None:
    """Copy the target's embeddings, final norm and its `layers` (one per draft layer, in order) into `draft`.

    A draft that starts from the target's own layers starts where distillation wants to end: near the
    target's distribution (the target's first and last layers keep its input and output spaces), so it
    needs far fewer steps to agree with it than a random start; the cost is a draft as wide as the target.
    """
    shape = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
    mine, theirs = draft.config, target.config
    differs = [
        f"{k} {getattr(mine, k)} vs {getattr(theirs, k)}" for k in shape if getattr(mine, k) != getattr(theirs, k)
    ]
    if differs:
        raise JobError(
            f"init_layers: the draft's shape differs from the target's ({', '.join(differs)}); set model.* to the "
            "target's shape (but for model.num_hidden_layers), or init_layers=[] for a random start"
        )
    count = target.config.num_hidden_layers
    if len(layers) != draft.config.num_hidden_layers or not all(0 <= i < count for i in layers):
        raise JobError(
            f"init_layers={layers}: name one target layer (0..{count - 1}) per draft layer "
            f"(model.num_hidden_layers={draft.config.num_hidden_layers})"
        )
    with torch.no_grad():
        draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        for mine, theirs in zip(draft.model.layers, layers, strict=True):
            mine.load_state_dict(target.model.layers[theirs].state_dict())


def train_draft(config: DraftJobConfig) -> Path:
    """Distill the draft described by `config` from its target; returns the draft's model directory."""
    check_train(config.train, config.model)
    if config.distill.temperature <= 0:
        raise JobError(f"distill.temperature={config.distill.temperature}: use a value > 0")
    tokenizer = load_tokenizer(config.target)
    try:
        target = AutoModelForCausalLM.from_pretrained(config.target, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise JobError(f"target={config.target!r} is not a loadable model directory ({exc}); run `train lm`") from None
    if target.config.vocab_size != len(tokenizer):
        raise JobError(
            f"target at {config.target} has {target.config.vocab_size} embeddings but its tokenizer "
            f"{len(tokenizer)} tokens; retrain the target with this tokenizer"
        )
    target.to(pick_device(config.train.device)).eval().requires_grad_(False)
    corpus = load_corpus(config.corpus)
    tokens = encode_documents(tokenizer, corpus.train)  # [N]
    draft = build_llama(config.model, tokenizer, config.train.seed)
    if config.init_layers:
        start_from_target(draft, target, list(config.init_layers))
    objective = distillation_loss(target, config.distill)
    trained_on = {"target_weights_sha256": weights_sha256(Path(config.target))}
    return train_and_export("draft", config, draft, objective, tokens, tokenizer, corpus.source, trained_on)

"""Medusa and blockwise decoding are greedy decoding, faster: equivalence in float64 is their
specification. Also: what the target hands a proposer equals a plain forward, trees on literal
choices, and heads refused for another target."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from drafted import assert_drafted
from job_config import job_config
from mixed_prompts import PROMPTS
from transformers import AutoModelForCausalLM

from pipeline.driver import run_job
from pipeline.errors import JobError
from strategies import registry
from strategies.artifacts.configs import HeadsConfig
from strategies.artifacts.heads import DraftHeads
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.methods.medusa import MEDUSA_TREE
from strategies.options import StrategyOptions
from strategies.proposers.medusa import HeadsProposer
from strategies.proposers.medusa_choices import chain_choices, check_choices
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft
from strategies.verification.proposer import Proposer
from strategies.verification.speculative import SpeculativeStrategy
from strategies.verification.verify import verify_inputs
from workers.common.model_files import weights_sha256
from workers.model_loading import load_models

K = 4
# A tree as deep as the heads (the default is shallower), with branches at every level.
TREE = [[0], [0, 0], [1], [0, 0, 0], [0, 1], [2], [1, 0], [0, 0, 0, 0], [0, 0, 1], [0, 2], [1, 1], [0, 0, 0, 1]]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def tiny_heads(runner: ModelRunner, model_dir: Path, seed: int = 0) -> DraftHeads:
    """Heads of random (non-zero) weights for the tiny target, as `train heads` would record them."""
    hidden = runner.model.config.hidden_size
    config = HeadsConfig(K, hidden, runner.vocab_size, target_path=str(model_dir), target_weights_sha256="")
    config.target_weights_sha256 = weights_sha256(model_dir)
    heads = DraftHeads(config)
    torch.manual_seed(seed)
    for block in heads.blocks:
        torch.nn.init.normal_(block[0].linear.weight, std=0.5)
    heads.use_lm_head(runner.model.get_output_embeddings().weight)
    return heads.double().eval()


def _params(n=24, **sampling):
    return GenerationParams(n, SamplingParams(**sampling), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _tokens(strategy, prompts, params):
    return [r.tokens for r in strategy.generate(_requests(prompts), params).rows]


class ScriptedHeads(HeadsProposer):
    """Heads that know the greedy continuation: head i ranks the true token at `truth_rank[i]` (right),
    or never among its candidates (wrong)."""

    def __init__(self, reference, choices, vocab_size, right=True, truth_rank=None):
        super().__init__("scripted_heads", None, choices)
        self.reference, self.vocab_size, self.right = reference, vocab_size, right
        self.truth_rank = truth_rank or {}

    def start(self, contexts, params, states):
        super().start(contexts, params, states)
        self.rows = list(range(len(contexts)))  # each row's index in `reference`

    def candidates(self, context):
        heads = max(len(c) for c in self.choices)
        ranked = []
        for i in range(heads):
            per_row = []
            for row, g in zip(self.rows, context.num_generated, strict=True):
                truth = self.reference[row][g + i] if g + i < len(self.reference[row]) else 0
                others = [(truth + 1 + r) % self.vocab_size for r in range(self.max_rank)]
                if self.right:
                    others.insert(self.truth_rank.get(i, 0), truth)
                per_row.append(others[: self.max_rank])
            ranked.append(per_row)
        return ranked


def _scripted(target, proposer, choices):
    depth = max(len(c) for c in choices)
    return SpeculativeStrategy(
        "scripted", target, [DraftingMethod("scripted", proposer, depth, len(choices), trees=True)]
    )


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_heads_strategies_equal_greedy(target, tiny_model_dir, prompts):
    """Scripted heads always right take the fewest verify steps, always wrong accept nothing; random heads
    through the registry draft every step. Catches the planted bug "Medusa's proposer raises from its
    third draft on" (the output stays greedy; the fault and the plain steps after it do not)."""
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    for choices in (TREE, chain_choices(K)):
        right = _scripted(target, ScriptedHeads(reference, choices, target.vocab_size), choices)
        out = right.generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert out.stats["tau"] > K  # every draft accepted: K + 1 tokens a step but the last
        assert_drafted(out.stats, every_step=True)
        assert sum(out.stats["verify_steps"].values()) == len(prompts) * -(-(params.max_new_tokens - 1) // (K + 1))
        wrong = _scripted(target, ScriptedHeads(reference, choices, target.vocab_size, right=False), choices)
        out = wrong.generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert out.stats["accepted_tokens"] == 0
        assert_drafted(out.stats, every_step=True)
    # Heads of random weights through the registry, as a job builds them.
    models = registry.Models(target, heads=tiny_heads(target, tiny_model_dir))
    for name in ("medusa", "blockwise"):
        out = registry.create(StrategyOptions(name=name), models).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert_drafted(out.stats, every_step=True)


def test_a_tree_accepts_down_a_branch_that_is_not_the_top_1(target):
    """Head 1 ranks the truth second: only the branch [0, 1] of the tree reaches depth 2."""
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    choices = [[0], [0, 0], [0, 1], [0, 1, 0]]
    proposer = ScriptedHeads(reference, choices, target.vocab_size, truth_rank={1: 1})
    out = _scripted(target, proposer, choices).generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["acceptance_by_position"][:3] == [1.0, 1.0, 1.0]
    assert_drafted(out.stats, every_step=True)
    chain = ScriptedHeads(reference, chain_choices(3), target.vocab_size, truth_rank={1: 1})
    out = _scripted(target, chain, chain_choices(3)).generate(_requests(PROMPTS), params)
    assert out.stats["acceptance_by_position"][1] == 0.0  # the top-1 chain never passes head 1


def test_sampled_medusa_emits_the_targets_own_keyed_samples(target, tiny_model_dir):
    params = _params(16, temperature=0.8, top_k=40, seed=3)
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    models = registry.Models(target, heads=tiny_heads(target, tiny_model_dir))
    out = registry.create(StrategyOptions(name="medusa"), models).generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, every_step=True)


def test_relaxed_and_typical_modes_refuse_or_run_as_documented(target, tiny_model_dir):
    models = registry.Models(target, heads=tiny_heads(target, tiny_model_dir))
    options = StrategyOptions(name="blockwise")
    options.blockwise.top_k = 3
    with pytest.raises(ValueError, match="temperature=0"):
        registry.create(options, models).generate(_requests(PROMPTS[:2]), _params(temperature=0.5))
    assert registry.lossy_reason("blockwise", options) is not None
    typical = StrategyOptions(name="medusa")
    typical.medusa.acceptance = "typical"
    assert registry.lossy_reason("medusa", typical) is not None
    rows = registry.create(typical, models).generate(_requests(PROMPTS), _params(12)).rows
    assert all(len(r.tokens) == 12 for r in rows)
    assert registry.auto_candidates(StrategyOptions(name="auto"), {"heads"}) == [
        "prompt_lookup",
        "lookahead",
        "medusa",
        "blockwise",
        "jacobi",
    ]
    assert "medusa" not in registry.auto_candidates(typical, {"heads", "draft"})


class RecordingProposer(Proposer):
    """Drafts the greedy continuation (every third call: nothing, so a plain step follows) and keeps,
    for every state it is handed, the context tokens that state belongs to."""

    name = "recorder"
    wants_hidden_states = True

    def __init__(self, reference):
        self.reference, self.calls, self.seen = reference, 0, []

    def start(self, contexts, params, states):
        self.rows = list(range(len(contexts)))
        self.contexts = [list(c) for c in contexts]
        self._record(states)

    def propose(self, context):
        self.calls += 1
        drafts = []
        for row, g, budget in zip(self.rows, context.num_generated, context.budgets, strict=True):
            drafts.append(Draft.chain([] if self.calls % 3 == 0 else self.reference[row][g : g + budget]))
        return drafts

    def emitted(self, emitted, states):
        for context, tokens in zip(self.contexts, emitted, strict=True):
            context.extend(tokens)
        self._record(states)

    def _record(self, states):
        for row, context in enumerate(self.contexts):
            kept = states.kept[row]
            # The kept states belong to the tokens before the pending one (the context's last).
            positions = list(range(len(context) - 1 - len(kept), len(context) - 1))
            self.seen.append((context[:-1], positions, states.hidden[row, kept].clone()))
            assert torch.equal(states.last()[row], states.hidden[row, kept[-1]])

    def keep_rows(self, rows):
        self.rows = [self.rows[r] for r in rows]
        self.contexts = [self.contexts[r] for r in rows]


@pytest.mark.parametrize("path", ["lean", "transformers"])
def test_states_handed_to_a_proposer_equal_a_plain_forward(tiny_model_dir, path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    runner = ModelRunner(model)
    if path == "transformers":
        runner._fast = None
    params = _params(14)
    reference = _tokens(AutoregressiveStrategy(runner), PROMPTS[:4], params)
    recorder = RecordingProposer(reference)
    strategy = SpeculativeStrategy("recorder", runner, [DraftingMethod("recorder", recorder, K, K)])
    out = strategy.generate(_requests(PROMPTS[:4]), params)
    assert [r.tokens for r in out.rows] == reference
    assert out.stats["steps_by_drafter"].get("autoregressive", 0) > 0 and out.stats["tau"] > 1
    kinds = {len(positions) for _, positions, _ in recorder.seen}
    assert {1}.issubset(kinds) and max(kinds) > 1  # plain steps, verify steps and prefills were all seen
    with torch.inference_mode():
        for tokens, positions, hidden in recorder.seen:
            full = model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]  # [T, H]
            assert torch.allclose(hidden, full[positions], atol=1e-10)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_batched_heads_equal_each_heads_own_resblocks(num_layers):
    """`features` runs every head's ResBlocks in one batched matmul per layer; `ResBlock.forward`,
    head by head, is its reference, for any number of heads, through weights changed in place."""
    torch.manual_seed(0)
    heads = DraftHeads(HeadsConfig(num_heads=3, hidden_size=8, vocab_size=20, num_layers=num_layers))
    heads = heads.double().requires_grad_(False)
    for p in heads.parameters():
        p.normal_()
    hidden = torch.randn(2, 5, 8, dtype=torch.float64)  # [B, T, H]

    def reference(k):
        return torch.stack([block(hidden) for block in heads.blocks[:k]])  # [k, B, T, H]

    for k in (1, 2, 3):
        assert torch.allclose(heads.features(hidden, k), reference(k), rtol=0, atol=1e-12)
    heads.blocks[2][num_layers - 1].linear.bias.add_(1.0)  # the stacked weights are stale now
    assert torch.allclose(heads.features(hidden), reference(3), rtol=0, atol=1e-12)
    assert torch.allclose(heads.features(hidden[0, 0]), reference(3)[:, 0, 0], rtol=0, atol=1e-12)  # one state [H]


def test_batched_heads_train_each_heads_own_weights():
    heads = DraftHeads(HeadsConfig(num_heads=3, hidden_size=8, vocab_size=20, num_layers=2))
    heads.features(torch.randn(4, 8))[1].sum().backward()  # head 1's states only
    grads = [[block[layer].linear.weight.grad for layer in range(2)] for block in heads.blocks]
    assert all(g is not None and g.abs().sum() > 0 for g in grads[1])
    assert all(g is None or not g.any() for g in grads[0] + grads[2])


def test_tree_shapes_and_choices_on_literal_inputs():
    proposer = HeadsProposer("medusa", None, [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    paths, parents = proposer._shape(depth=2, nodes=4)
    assert paths == [(0,), (1,), (0, 0), (0, 1)] and parents == [-1, -1, 0, 0]
    assert proposer._shape(depth=0, nodes=16) == ([], [])
    assert proposer._shape(depth=3, nodes=16)[1] == [-1, -1, 0, 0, 1, 2]
    assert "prefix" in check_choices([[0, 1], [0]], num_heads=4, vocab_size=10)
    assert "deeper" in check_choices([[0], [0, 0]], num_heads=1, vocab_size=10)
    assert "twice" in check_choices([[0], [0]], num_heads=4, vocab_size=10)
    assert check_choices(TREE, num_heads=4, vocab_size=10) is None
    assert check_choices(MEDUSA_TREE, num_heads=4, vocab_size=10) is None
    # The verifier's inputs for that tree below pending token 7, next position 5, and a chain row.
    tree = Draft([10, 11, 12, 13], [-1, -1, 0, 0])
    inputs = verify_inputs([7, 8], [tree, Draft.chain([20])], torch.tensor([5, 3]))
    assert inputs.ids.tolist() == [[7, 10, 11, 12, 13], [8, 20, 0, 0, 0]]
    assert inputs.positions.tolist() == [[5, 6, 6, 7, 7], [3, 4, 3, 3, 3]]
    assert inputs.valid.tolist() == [[True] * 5, [True, True, False, False, False]]
    assert inputs.attend[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]


def test_heads_for_another_target_are_refused(tmp_path, tiny_model_dir, tiny_draft_dir, target):
    heads = tiny_heads(target, tiny_model_dir)
    heads.config.target_weights_sha256 = weights_sha256(tiny_draft_dir)
    heads.config.target_path = str(tiny_draft_dir)
    heads.save(tmp_path / "heads")
    with pytest.raises(ValueError, match=f"trained for the target at {tiny_draft_dir}"):
        load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"heads": str(tmp_path / "heads")})
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"prompt": ["x = 1"]}), tmp_path / "in" / "a.parquet")
    config = job_config(tmp_path, tiny_model_dir, "strategy.name=medusa", f"model.heads={tmp_path / 'heads'}")
    with pytest.raises(JobError, match=f"model.target {tiny_model_dir}"):
        run_job(config)
    with pytest.raises(JobError, match="needs heads trained on the target"):
        run_job(job_config(tmp_path, tiny_model_dir, "strategy.name=medusa"))


def test_medusa_job_equals_greedy_and_its_heads_are_part_of_its_identity(tmp_path, tiny_model_dir, target):
    heads = tiny_heads(target, tiny_model_dir)
    heads.save(tmp_path / "heads")
    (tmp_path / "in").mkdir()
    prompts = ["def f(x):", "import os", "class A:", "for i in range(3):"]
    pq.write_table(pa.table({"prompt": prompts}), tmp_path / "in" / "a.parquet")
    common = ["model.dtype=float64", "generation.max_new_tokens=10", "generation.ignore_eos=true"]
    try:
        assert run_job(job_config(tmp_path, tiny_model_dir, *common, "output.url=" + str(tmp_path / "ar"))).status
        greedy = pq.read_table(tmp_path / "ar").to_pylist()
        medusa = [*common, "strategy.name=medusa", "strategy.adaptive=false", f"model.heads={tmp_path / 'heads'}"]
        assert run_job(job_config(tmp_path, tiny_model_dir, *medusa)).status == "succeeded"
        rows = pq.read_table(tmp_path / "out").to_pylist()
        assert [r["completion"] for r in rows] == [r["completion"] for r in greedy]
        assert {r["strategy"] for r in rows} == {"medusa"}
        manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
        assert manifest["lossy"] == {} and "heads" in manifest["identity"]["model"]["weights_sha256"]
        typical = job_config(tmp_path, tiny_model_dir, *medusa, "strategy.medusa.acceptance=typical")
        typical.output.url = str(tmp_path / "typical")
        assert run_job(typical).status == "succeeded"
        manifest = json.loads((tmp_path / "typical" / "_manifest.json").read_text())
        assert "typical" in manifest["lossy"]["medusa"]
        # Other heads: another job (its output folder refuses it), not a resume of this one.
        tiny_heads(target, tiny_model_dir, seed=1).save(tmp_path / "heads")
        with pytest.raises(JobError, match="different job"):
            run_job(job_config(tmp_path, tiny_model_dir, *medusa))
    finally:
        ray.shutdown()


class RecordingHeads(HeadsProposer):
    """Keeps the tokens of every draft it proposes."""

    drafted: list[int]

    def propose(self, context):
        drafts = super().propose(context)
        self.drafted = getattr(self, "drafted", []) + [t for d in drafts for t in d.tokens]
        return drafts


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_a_draft_vocabulary_drafts_only_its_tokens_and_the_output_is_greedy(target, tiny_model_dir, prompts):
    """The heads score the draft vocabulary's rows of the LM head alone and draft target ids from them; the
    target verifies with its whole vocabulary, so the tokens are greedy decoding's whatever the vocabulary."""
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    heads = tiny_heads(target, tiny_model_dir)
    full = heads.draft_logits(torch.randn(3, heads.config.hidden_size, dtype=torch.float64))
    subset = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(0))[:40]
    heads.use_draft_vocab(subset)
    assert heads.drafted_tokens == 40
    hidden = torch.randn(3, heads.config.hidden_size, dtype=torch.float64)
    assert torch.allclose(heads.draft_logits(hidden), heads(hidden)[..., subset])  # [K, 3, 40]: those rows alone
    assert full.shape[-1] == target.vocab_size  # without a vocabulary: every token
    for choices in (TREE, chain_choices(K)):
        proposer = RecordingHeads("recording", heads, choices)
        assert _tokens(_scripted(target, proposer, choices), prompts, params) == reference
        assert proposer.drafted and set(proposer.drafted) <= set(subset.tolist())
    heads.use_draft_vocab(torch.tensor([5, 9]))
    with pytest.raises(ValueError, match="ranks 3 tokens of a head, the heads draft 2"):
        HeadsProposer("medusa", heads, TREE)


def test_heads_load_their_draft_vocabulary_and_refuse_one_that_is_missing(tmp_path, tiny_model_dir, target):
    from strategies.artifacts.draft_vocab import DRAFT_VOCAB_FILE, save_draft_vocab
    from strategies.artifacts.heads import load_heads

    heads = tiny_heads(target, tiny_model_dir)
    heads.config.draft_vocab_size = 4
    heads.save(tmp_path)
    token_ids = torch.tensor([7, 3, 25, 0])
    save_draft_vocab(tmp_path, token_ids, torch.tensor([9, 5, 2, 1]))
    loaded = load_heads(tmp_path, torch.float64, torch.device("cpu"))
    loaded.use_lm_head(target.model.get_output_embeddings().weight)
    assert torch.equal(loaded.draft_ids, token_ids)
    assert torch.equal(loaded.draft_lm_head, target.model.get_output_embeddings().weight[token_ids])
    assert loaded.to_target(torch.tensor([[2, 0]])).tolist() == [[25, 7]]
    assert load_heads(tmp_path, torch.float64, torch.device("cpu"), draft_vocab=False).draft_ids is None
    (tmp_path / DRAFT_VOCAB_FILE).unlink()
    missing = r"draft_vocab_size=4 but .* is missing: write it again with `accelgen train heads"
    with pytest.raises(ValueError, match=missing):
        load_heads(tmp_path, torch.float64, torch.device("cpu"))
    own = DraftHeads(HeadsConfig(K, heads.config.hidden_size, target.vocab_size, shared_lm_head=False))
    with pytest.raises(ValueError, match="needs heads that share the target's LM head"):
        own.use_draft_vocab(token_ids)

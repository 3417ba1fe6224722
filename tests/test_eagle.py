"""EAGLE is greedy decoding (and the target's keyed sampling), faster: equivalence in float64 is its
specification, with chains, static and dynamic trees, heads scripted always right, always wrong, right to a
depth, and of random weights. Also: the trees' growing and reranking on literal probabilities, the
head's cache after partial acceptance equal to a fresh one, and a head for another target refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from drafted import assert_drafted
from mixed_prompts import PROMPTS
from transformers import AutoModelForCausalLM

from jobs.shipped import SHIPPED_TARGET, shipped
from strategies import registry
from strategies.artifacts.configs import EagleConfig
from strategies.artifacts.draft_vocab import DRAFT_VOCAB_FILE, save_draft_vocab
from strategies.artifacts.eagle import EagleHead, load_eagle
from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.methods import eagle as eagle_method
from strategies.options import StrategyOptions
from strategies.proposers.eagle import EagleProposer
from strategies.proposers.eagle_tree import first_nodes, grow, grow_static, rerank, static_tree
from strategies.runtime.kv_cache import SlotLayer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.runtime.target_states import TargetStates
from strategies.verification.drafting import DraftingMethod
from strategies.verification.proposer import ProposalContext
from strategies.verification.rules import ExactMatch
from strategies.verification.speculative import SpeculativeStrategy
from workers.common.model_files import weights_sha256
from workers.model_loading import load_models

DEPTH = 4


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def tiny_eagle(runner: ModelRunner, model_dir: Path, seed: int = 0) -> EagleHead:
    """A head of random weights for the tiny target, as `train eagle` would record it."""
    config = EagleConfig.of_target(
        runner.model, target_path=str(model_dir), target_weights_sha256=weights_sha256(model_dir)
    )
    torch.manual_seed(seed)
    head = EagleHead(config).double().eval()
    head.use_target(runner.model)
    return head


def _params(n=24, **sampling):
    return GenerationParams(n, SamplingParams(**sampling), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _tokens(strategy, prompts, params):
    return [r.tokens for r in strategy.generate(_requests(prompts), params).rows]


class ScriptedEagle(EagleProposer):
    """The head feeds its cache and drafts as usual, but its confidences are scripted: the reference
    continuation's token ranks first down to depth `right_depth`, below which it is never a candidate."""

    def __init__(self, head, top_k, sequences, right_depth, static_nodes=0):
        super().__init__(head, top_k, static_nodes)
        self.sequences, self.right_depth = sequences, right_depth
        self.roots: list[tuple[list[int], torch.Tensor]] = []  # (context, root feature) of every proposal

    def _feed_target_features(self):
        root = super()._feed_target_features()
        self.roots += [(list(row.context), root[b].clone()) for b, row in enumerate(self.rows)]
        return root

    def _grow(self, root, depth, nodes):
        self.level = 0
        return super()._grow(root, depth, nodes)

    def _log_confidence(self, features):
        level, vocab = self.level, self.head.config.vocab_size
        self.level += 1
        logits = torch.zeros(*features.shape[:-1], vocab, dtype=torch.float64)
        for b, row in enumerate(self.rows):
            sequence = next(s for s in self.sequences if s[: len(row.context)] == row.context)
            at = len(row.context) + level  # the index of the token at draft depth level + 1
            truth = sequence[at] if at < len(sequence) else 0
            if level < self.right_depth:
                logits[b, ..., truth], logits[b, ..., (truth + 1) % vocab] = 5.0, 4.0
            else:
                logits[b, ..., truth] = -1e9
        return torch.log_softmax(logits, dim=-1)


def _scripted(target, proposer, tree):
    nodes = 12 if tree else DEPTH
    method = DraftingMethod("eagle", proposer, DEPTH, nodes, trees=tree)
    return SpeculativeStrategy("eagle", target, [method])


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_eagle_equals_greedy(target, tiny_model_dir, prompts):
    """Catches the planted bug "EAGLE head cache never truncated": the proposer raises at its second
    step and the loop decodes plainly, still greedy; the fault and the verify-step count show it."""
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    sequences = [p + r for p, r in zip(prompts, reference, strict=True)]
    head = tiny_eagle(target, tiny_model_dir)
    for top_k, tree, static_nodes in ((1, False, 0), (3, True, 0), (3, True, 12)):
        right = ScriptedEagle(head, top_k, sequences, right_depth=DEPTH, static_nodes=static_nodes)
        out = _scripted(target, right, tree).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert out.stats["tau"] > DEPTH  # every draft accepted: DEPTH + 1 tokens a step but the last
        # ...at every step of every row: a head that raises after its first step ("head cache never
        # truncated") leaves τ at DEPTH + 1 over the one step it verified, and plain steps after it.
        assert_drafted(out.stats, every_step=True)
        assert sum(out.stats["verify_steps"].values()) == len(prompts) * -(-(params.max_new_tokens - 1) // (DEPTH + 1))
        wrong = ScriptedEagle(head, top_k, sequences, right_depth=0, static_nodes=static_nodes)
        out = _scripted(target, wrong, tree).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert out.stats["accepted_tokens"] == 0
        assert_drafted(out.stats, every_step=True)
    # A head of random weights through the registry, as a job builds it: chain, static and dynamic tree.
    models = registry.Models(target, eagle=head)
    for tree in ("chain", "static", "dynamic"):
        options = StrategyOptions(name="eagle")
        options.eagle.tree = tree
        out = registry.create(options, models).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert_drafted(out.stats, every_step=True)


class RecordingEagle(EagleProposer):
    """Keeps every draft it proposes: its tokens, per row and step."""

    drafted: list[list[int]]

    def propose(self, context):
        drafts = super().propose(context)
        self.drafted = getattr(self, "drafted", []) + [d.tokens for d in drafts]
        return drafts


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_a_draft_vocabulary_drafts_only_its_tokens_and_the_output_is_greedy(target, tiny_model_dir, prompts):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    head = tiny_eagle(target, tiny_model_dir)
    vocab = head.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    permuted, subset = torch.randperm(vocab, generator=generator), torch.randperm(vocab, generator=generator)[:100]

    def drafts(token_ids, static_nodes):
        head.use_draft_vocab(token_ids)
        proposer = RecordingEagle(head, 3, static_nodes)
        assert _tokens(_scripted(target, proposer, tree=True), prompts, params) == reference
        return proposer.drafted

    for static_nodes in (0, 12):
        whole = drafts(None, static_nodes)
        # The whole vocabulary in another order drafts the same tokens: indices map back to the target's ids.
        assert drafts(permuted, static_nodes) == whole
        # A third of it drafts only its own tokens, and the target's verification keeps the output greedy.
        allowed = set(subset.tolist())
        assert all(set(tokens) <= allowed for tokens in drafts(subset, static_nodes)) and any(map(len, whole))
    options = StrategyOptions(name="eagle")
    for tree in ("chain", "static", "dynamic"):
        options.eagle.tree = tree
        assert _tokens(registry.create(options, registry.Models(target, eagle=head)), prompts, params) == reference


def test_the_heads_cache_after_partial_acceptance_equals_a_fresh_run_over_the_accepted_tokens(target, tiny_model_dir):
    params = _params(20)
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    sequences = [p + r for p, r in zip(PROMPTS, reference, strict=True)]
    head = tiny_eagle(target, tiny_model_dir)
    partial = ScriptedEagle(head, 3, sequences, right_depth=2)
    out = _scripted(target, partial, tree=True).generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, every_step=True)
    assert out.stats["acceptance_by_position"][:3] == [1.0, 1.0, 0.0]  # every step accepts 2 of its drafts
    later = [(context, root) for context, root in partial.roots if len(context) > 8]
    assert len(later) > 10
    for context, root in later:
        with torch.inference_mode():
            kv = target.new_kv(1)
            hidden = target.prefill(kv, [context[:-1]], want_hidden=True).hidden  # [1, L, H]
        fresh = EagleProposer(head, 3)
        fresh.start([context], params, TargetStates(hidden, [list(range(len(context) - 1))]))
        with torch.inference_mode():
            assert torch.allclose(fresh._feed_target_features()[0], root, atol=1e-9)


def test_the_heads_drafting_pass_predicts_what_its_training_pass_does(target, tiny_model_dir):
    """One input at a time over its cache, with the fused weights taken once and the rotary tables made
    ahead (as drafting runs it), the head predicts the features of its causal pass over the chain (as
    training runs it)."""
    head = tiny_eagle(target, tiny_model_dir)
    generator = torch.Generator().manual_seed(1)
    n = 6
    features = torch.randn(2, n, head.config.hidden_size, dtype=torch.float64, generator=generator)
    tokens = torch.randint(0, head.config.vocab_size, (2, n), generator=generator)
    positions = torch.arange(n).expand(2, -1) + torch.tensor([[0], [3]])
    with torch.inference_mode():
        causal = head(features, tokens, positions)  # [2, n, H]
        weights, (cos, sin), layer = head.layer_weights(), head.math.rope(positions, torch.float64), SlotLayer()
        steps = [
            head(
                features[:, i : i + 1],
                tokens[:, i : i + 1],
                (cos[:, :, i : i + 1], sin[:, :, i : i + 1]),
                torch.ones(2, 1, i + 1, dtype=torch.bool),
                layer,
                weights,
            )
            for i in range(n)
        ]
    assert torch.allclose(torch.cat(steps, dim=1), causal, atol=1e-12)


def test_sampled_eagle_emits_the_targets_own_keyed_samples(target, tiny_model_dir):
    params = _params(16, temperature=0.8, top_k=40, seed=3)
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    head = tiny_eagle(target, tiny_model_dir)
    for tree in ("chain", "static", "dynamic"):
        options = StrategyOptions(name="eagle")
        options.eagle.tree = tree
        assert _tokens(registry.create(options, registry.Models(target, eagle=head)), PROMPTS, params) == reference
    # Drafts that are the target's own samples are accepted, and the output is still the target's.
    sequences = [p + r for p, r in zip(PROMPTS, reference, strict=True)]
    out = _scripted(target, ScriptedEagle(head, 3, sequences, right_depth=DEPTH), True).generate(
        _requests(PROMPTS), params
    )
    assert [r.tokens for r in out.rows] == reference and out.stats["tau"] > DEPTH
    assert_drafted(out.stats, every_step=True)


def _table(probabilities: dict[tuple[int, ...], dict[int, float]], vocab: int):
    """Log-probabilities below each path of tokens, from a literal table (absent tokens: 0)."""

    def log_probs(path: tuple[int, ...]) -> torch.Tensor:
        row = torch.full((vocab,), -math.inf, dtype=torch.float64)
        for token, p in probabilities[path].items():
            row[token] = math.log(p)
        return row

    return log_probs


def test_the_dynamic_tree_grows_the_most_confident_nodes_and_reranks_to_the_budget():
    a, b, c, d, e, f, g, h, i, j = range(10)
    table = {
        (): {a: 0.6, b: 0.3, c: 0.1},
        (a,): {d: 0.7, e: 0.2, j: 0.1},
        (b,): {f: 0.9, g: 0.1},
        (a, d): {i: 0.8, j: 0.2},
        (b, f): {i: 0.6, h: 0.4},
    }
    log_probs = _table(table, vocab=10)
    paths: dict[int, tuple[int, ...]] = {}  # the frontier being expanded: its index -> its path

    def expand(tokens, parents, level):
        nonlocal paths
        previous = paths if level > 1 else {-1: ()}
        paths = {n: previous[int(p)] + (int(t),) for n, (t, p) in enumerate(zip(tokens[0], parents[0], strict=True))}
        return torch.stack([log_probs(paths[n]) for n in range(len(paths))])[None]

    grown = grow(log_probs(())[None], depth=3, top_k=2, expand=expand)
    # Depth 1: a, b (c is not among the root's top 2). Depth 2: a's d, e and b's f, g. Depth 3: below the
    # two most confident of those, a-d (0.42) and b-f (0.27), not a-e (0.12).
    assert grown.tokens[0].tolist() == [a, b, d, e, f, g, i, j, i, h]
    assert grown.parents[0].tolist() == [-1, -1, 0, 0, 1, 1, 2, 2, 4, 4]
    assert grown.depths[0].tolist() == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    values = grown.values[0].exp().tolist()
    assert values == pytest.approx([0.6, 0.3, 0.42, 0.12, 0.27, 0.03, 0.336, 0.084, 0.162, 0.108])
    # Reranked to 4 nodes: a, a-d, a-d-i, b, listed parents first.
    [draft] = rerank(grown, budgets=[3], max_nodes=4)
    assert draft.tokens == [a, b, d, i] and draft.parents == [-1, -1, 0, 2]
    [draft] = rerank(grown, budgets=[3], max_nodes=6)
    assert draft.tokens == [a, b, d, f, i, i] and draft.parents == [-1, -1, 0, 1, 2, 3]
    # A row with room for one token keeps depth 1 only; a row without room drafts nothing.
    both = type(grown)(*(t.expand(2, -1) for t in vars(grown).values()))
    short, none = rerank(both, budgets=[1, 0], max_nodes=6)
    assert short.tokens == [a, b] and short.parents == [-1, -1] and none.tokens == []
    # A chain is the tree one node wide.
    chain = grow(log_probs(())[None], depth=3, top_k=1, expand=expand)
    assert chain.tokens[0].tolist() == [a, d, i] and chain.parents[0].tolist() == [-1, 0, 1]
    # Equal values keep the node grown first, so a kept node's parent is always kept: below b, f is
    # certain (b-f ties b at 0.3): 3 nodes keep a, a-d and b, never f without b.
    table[(b,)] = {f: 1.0}
    [draft] = rerank(grow(log_probs(())[None], depth=2, top_k=2, expand=expand), budgets=[2], max_nodes=3)
    assert draft.tokens == [a, b, d] and draft.parents == [-1, -1, 0]


def test_no_node_deeper_than_the_node_budget_is_kept_so_the_tree_grows_no_deeper():
    """The proposer grows a dynamic tree only as deep as its node budget: the rerank keeps the same nodes."""
    a, b, c, d, e, f = range(6)
    table = {
        (): {a: 0.9, b: 0.1},
        (a,): {c: 0.99, d: 0.01},
        (b,): {a: 1.0},
        (a, c): {e: 0.99, f: 0.01},
        (b, a): {b: 1.0},
        (a, c, e): {a: 1.0},  # certain: a-c-e-a ties a-c-e, which was grown first and is kept first
        (b, a, b): {a: 1.0},
    }
    log_probs = _table(table, vocab=6)
    paths: dict[int, tuple[int, ...]] = {}

    def expand(tokens, parents, level):
        nonlocal paths
        previous = paths if level > 1 else {-1: ()}
        paths = {n: previous[int(p)] + (int(t),) for n, (t, p) in enumerate(zip(tokens[0], parents[0], strict=True))}
        return torch.stack([log_probs(paths[n]) for n in range(len(paths))])[None]

    for nodes in (1, 2, 3):
        deep = rerank(grow(log_probs(())[None], depth=4, top_k=2, expand=expand), budgets=[4], max_nodes=nodes)
        capped = rerank(grow(log_probs(())[None], depth=nodes, top_k=2, expand=expand), budgets=[4], max_nodes=nodes)
        assert (capped[0].tokens, capped[0].parents) == (deep[0].tokens, deep[0].parents)
    assert deep[0].tokens == [a, c, e]  # the certain chain: the deepest a budget of 3 can keep


def test_a_smaller_node_budget_runs_fewer_head_passes_and_drafts_the_trees_first_nodes(target, tiny_model_dir):
    """A static tree cut to a node budget grows only the nodes kept; a dynamic one no deeper than the budget."""
    head = tiny_eagle(target, tiny_model_dir)
    contexts = [list(p) for p in PROMPTS[:3]]
    with torch.inference_mode():
        kv = target.new_kv(len(contexts))
        hidden = target.prefill(kv, [c[:-1] for c in contexts], want_hidden=True).hidden  # [B, L, H] left-padded
    width = hidden.shape[1]
    states = TargetStates(hidden, [list(range(width - len(c) + 1, width)) for c in contexts])

    def drafted(static_nodes, nodes):
        proposer = EagleProposer(head, top_k=3, static_nodes=static_nodes)
        proposer.start(contexts, _params(), states)
        passes = []
        forward = head.forward
        head.forward = lambda features, *rest: passes.append(features.shape[1]) or forward(features, *rest)
        try:
            context = ProposalContext([1] * len(contexts), [DEPTH] * len(contexts), nodes, torch.zeros(3))
            drafts = proposer.propose(context)
        finally:
            del head.forward
        return [(d.tokens, d.parents) for d in drafts], len(passes) - 1  # less the pass feeding the features

    whole, whole_passes = drafted(static_nodes=12, nodes=12)
    cut, cut_passes = drafted(static_nodes=12, nodes=4)  # [0] [0, 0] [1] [0, 0, 0]: expanded at depths 1 and 2
    assert [(t[:4], p[:4]) for t, p in whole] == cut
    assert (whole_passes, cut_passes) == (len([lv for lv in static_tree(12, DEPTH, 3).levels if len(lv.frontier)]), 2)
    _, dynamic_passes = drafted(static_nodes=0, nodes=2)
    assert dynamic_passes == 1  # depth 2: one expansion below the root's children


def test_the_static_tree_is_the_most_likely_rank_paths_under_its_fixed_prior():
    # Chances 0.6, 0.24, 0.096 by rank, multiplied along the path: [0] .6, [0, 0] .36, [1] .24, [0, 0, 0] .216,
    # then [0, 1] and [1, 0] .144 (a tie: the lower ranks first), [2] .096.
    tree = static_tree(nodes=7, depth=3, top_k=3)
    assert tree.paths == ((0,), (0, 0), (1,), (0, 0, 0), (0, 1), (1, 0), (2,))
    assert tree.parents == (-1, 0, -1, 1, 0, 2, -1)
    assert static_tree(nodes=7, depth=1, top_k=3).paths == ((0,), (1,), (2,))  # no deeper than depth
    assert static_tree(nodes=4, depth=5, top_k=1).paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))  # a chain
    # Every first n nodes hold their ancestors.
    big = static_tree(nodes=40, depth=5, top_k=4)
    assert all(path[:-1] in big.paths[:n] for n, path in enumerate(big.paths) if len(path) > 1)


def test_the_static_tree_grows_its_shape_one_depth_per_call_and_keeps_its_first_nodes():
    a, b, c, d, e, f, g, h, i = range(9)
    table = {
        (): {a: 0.5, b: 0.3, c: 0.2},
        (a,): {d: 0.6, e: 0.4},
        (b,): {f: 0.9, g: 0.1},
        (a, d): {h: 0.7, i: 0.3},
    }
    log_probs = _table(table, vocab=9)
    calls: list[list[tuple[int, ...]]] = []  # per call, the paths of the nodes expanded
    paths: dict[int, tuple[int, ...]] = {}

    def expand(tokens, parents, level):
        nonlocal paths
        previous = paths if level > 1 else {-1: ()}
        paths = {n: previous[int(p)] + (int(t),) for n, (t, p) in enumerate(zip(tokens[0], parents[0], strict=True))}
        calls.append(list(paths.values()))
        return torch.stack([log_probs(paths[n]) for n in range(len(paths))])[None]

    tree = static_tree(nodes=7, depth=3, top_k=3)  # [0] [0,0] [1] [0,0,0] [0,1] [1,0] [2]
    grown = grow_static(log_probs(())[None], tree, expand)
    # One call per depth with children, on every node of it that has some: a and b, then a-d.
    assert calls == [[(a,), (b,)], [(a, d)]]
    assert grown.tokens[0].tolist() == [a, d, b, h, e, f, c]
    assert grown.parents[0].tolist() == [-1, 0, -1, 1, 0, 2, -1]
    assert grown.depths[0].tolist() == [1, 2, 1, 3, 2, 2, 1]
    assert grown.values[0].exp().tolist() == pytest.approx([0.5, 0.3, 0.3, 0.21, 0.2, 0.27, 0.2])
    # The shape, not the confidence, decides what a smaller budget keeps: its first nodes that fit.
    [draft] = first_nodes(grown, budgets=[3], max_nodes=4)
    assert draft.tokens == [a, d, b, h] and draft.parents == [-1, 0, -1, 1]
    both = type(grown)(*(t.expand(2, -1) for t in vars(grown).values()))
    shallow, none = first_nodes(both, budgets=[1, 0], max_nodes=7)
    assert shallow.tokens == [a, b, c] and shallow.parents == [-1, -1, -1] and none.tokens == []


def test_a_head_for_another_target_is_refused(tmp_path, tiny_model_dir, tiny_draft_dir, target):
    head = tiny_eagle(target, tiny_model_dir)
    head.save(tmp_path / "eagle")
    loaded = load_eagle(tmp_path / "eagle", torch.float64, torch.device("cpu"))
    assert all(torch.equal(p, q) for p, q in zip(loaded.state_dict().values(), head.state_dict().values(), strict=True))
    assert "embed" not in str(list(loaded.state_dict()))  # the target's own tensors are never saved with it
    models = load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"eagle": str(tmp_path / "eagle")})
    assert models.models.get("eagle").lm_head is not None
    head.config.target_weights_sha256 = weights_sha256(tiny_draft_dir)
    head.config.target_path = str(tiny_draft_dir)
    head.save(tmp_path / "other")
    with pytest.raises(ValueError, match=f"trained for the target at {tiny_draft_dir}.*model.target {tiny_model_dir}"):
        load_models(str(tiny_model_dir), torch.float64, torch.device("cpu"), {"eagle": str(tmp_path / "other")})


def test_a_draft_vocabulary_is_loaded_with_its_head_and_checked(tmp_path, tiny_model_dir, target):
    head = tiny_eagle(target, tiny_model_dir)
    token_ids = torch.tensor([7, 3, 250, 0])
    head.config.draft_vocab_size = 4
    head.save(tmp_path)
    save_draft_vocab(tmp_path, token_ids, torch.tensor([9, 5, 2, 1]))
    loaded = load_eagle(tmp_path, torch.float64, torch.device("cpu"))
    loaded.use_target(target.model)
    assert torch.equal(loaded.draft_ids, token_ids)
    assert torch.equal(loaded.draft_lm_head, target.model.get_output_embeddings().weight[token_ids])
    assert loaded.to_target(torch.tensor([[2, 0]])).tolist() == [[250, 7]]

    def refused(match):
        with pytest.raises(ValueError, match=match):
            load_eagle(tmp_path, torch.float64, torch.device("cpu"))

    save_draft_vocab(tmp_path, torch.tensor([7, 3, 250]), torch.tensor([9, 5, 2]))
    refused(r"draft_vocab\.safetensors holds token_ids of shape \(3,\), eagle\.json says draft_vocab_size=4")
    save_draft_vocab(tmp_path, torch.tensor([7, 3, 3, 0]), torch.tensor([9, 5, 2, 1]))
    refused("token_ids must be distinct ids below vocab_size")
    save_draft_vocab(tmp_path, torch.tensor([7, 3, 9999, 0]), torch.tensor([9, 5, 2, 1]))
    refused("token_ids must be distinct ids below vocab_size")
    (tmp_path / DRAFT_VOCAB_FILE).write_bytes(b"not safetensors")
    refused("draft_vocab.safetensors is not a safetensors file")
    (tmp_path / DRAFT_VOCAB_FILE).unlink()
    refused("draft_vocab_size=4 but .*draft_vocab.safetensors is missing: write it again with `accelgen train eagle")
    save_draft_vocab(tmp_path, token_ids, torch.tensor([9, 5, 2, 1]))
    head.config.draft_vocab_size = 0
    head.save(tmp_path)
    refused("draft_vocab.safetensors exists but .*eagle.json says draft_vocab_size=0")


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_the_shipped_head_on_the_shipped_target_equals_greedy(prompts):
    loaded = load_models(str(SHIPPED_TARGET), torch.float64, torch.device("cpu"), {"eagle": str(shipped("eagle"))})
    target, models = loaded.models.target, loaded.models
    params = _params(24)
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    for tree in ("chain", "static", "dynamic"):
        options = StrategyOptions(name="eagle")
        options.eagle.tree = tree
        out = registry.create(options, models).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert_drafted(out.stats, every_step=True, tau_at_least=2.0)  # its τ floors: test_shipped_tau.py


def test_a_proposer_fuses_the_heads_weights_once_and_again_only_after_they_change(target, tiny_model_dir):
    """Fused for every batch, the weights were new tensors that `linear` packed again at every prompt;
    a training step changes the parameters in place, and the next batch must draft with the new ones."""
    head = tiny_eagle(target, tiny_model_dir)
    proposer = EagleProposer(head, 3)
    context = list(PROMPTS[0])
    with torch.inference_mode():
        kv = target.new_kv(1)
        hidden = target.prefill(kv, [context[:-1]], want_hidden=True).hidden
    states = TargetStates(hidden, [list(range(len(context) - 1))])
    proposer.start([context], _params(), states)
    first = proposer.weights
    proposer.start([context], _params(), states)
    assert proposer.weights is first
    with torch.no_grad():
        head.q_proj.weight.add_(1.0)
    proposer.start([context], _params(), states)
    assert proposer.weights is not first
    q_rows = head.q_proj.weight.shape[0]
    assert torch.equal(proposer.weights.w_qkv[:q_rows], head.q_proj.weight)


def test_the_drafting_method_carries_the_held_out_tau_the_heads_card_records_for_its_tree(target, tiny_model_dir):
    """The controller orders exploration by it (`DraftLimits.card_tau`); a tree the card did not measure,
    or a card without the record, gives none."""
    head = tiny_eagle(target, tiny_model_dir)
    head.config.training = {"heldout_acceptance": {"static": {"tau": 4.39}, "chain": {"tau": 3.77}}}
    models = registry.Models(target, eagle=head)
    for tree, expected in (("static", 4.39), ("chain", 3.77), ("dynamic", None)):
        options = StrategyOptions(name="eagle")
        options.eagle.tree = tree
        assert eagle_method.drafting(options, models, ExactMatch()).limits().card_tau == expected
    head.config.training = {}
    assert eagle_method.drafting(StrategyOptions(name="eagle"), models, ExactMatch()).limits().card_tau is None

"""Speculative decoding is greedy decoding, faster: equivalence in float64 is its specification."""

from __future__ import annotations

import pytest
import torch
from drafted import assert_drafted
from mixed_prompts import PROMPTS
from scripted_proposer import ScriptedProposer
from transformers import AutoModelForCausalLM

from strategies.base import FINISH_LENGTH, FINISH_STOP, GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.proposers.draft_model import DraftModelProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.acceptance import ACCEPTORS
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft, tree_attention
from strategies.verification.rules import Relaxed
from strategies.verification.speculative import SpeculativeStrategy
from strategies.verification.tree_walks import Verdict
from strategies.verification.verify import Verification, verify, verify_inputs
from workers.common.spec import tally_faults

K = 4


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(_load(tiny_model_dir))


@pytest.fixture(scope="module")
def random_draft(tiny_draft_dir):
    return ModelRunner(_load(tiny_draft_dir))


def _spec(name, runner, proposer, rule=None):
    drafter = DraftingMethod(name, proposer, K, K) if rule is None else DraftingMethod(name, proposer, K, K, rule)
    return SpeculativeStrategy(name, runner, [drafter])


def _params(n=24, eos=frozenset(), ignore_eos=True, **sampling):
    return GenerationParams(n, SamplingParams(**sampling), eos_token_ids=eos, ignore_eos=ignore_eos)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _tokens(strategy, prompts, params):
    return [r.tokens for r in strategy.generate(_requests(prompts), params).rows]


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch8"])
def test_speculative_equals_autoregressive(target, random_draft, tiny_model_dir, prompts):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), prompts, params)
    same_model = ModelRunner(_load(tiny_model_dir))
    for draft in (same_model, random_draft):
        spec = _spec("speculative", target, DraftModelProposer(draft, target.vocab_size))
        out = spec.generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert_drafted(out.stats, every_step=True)
        if draft is same_model:  # every draft accepted: k+1 tokens per forward until the end
            assert out.stats["accepted_tokens"] == out.stats["draft_tokens"]
            assert out.target_forwards <= len(prompts) * -(-(params.max_new_tokens - 1) // (K + 1))
    for right in (True, False):
        proposer = ScriptedProposer(reference, target.vocab_size, right)
        out = _spec("scripted", target, proposer).generate(_requests(prompts), params)
        assert [r.tokens for r in out.rows] == reference
        assert_drafted(out.stats, every_step=True)
        if right:  # K + 1 tokens a step but the last: every row's steps, each a verify step
            assert out.stats["tau"] > K
            assert sum(out.stats["verify_steps"].values()) == len(prompts) * _steps(params.max_new_tokens, K)
        else:
            assert out.stats["accepted_tokens"] == 0 and out.stats["draft_tokens"] > 0


def _steps(new_tokens: int, depth: int) -> int:
    """Verify steps a row takes when every draft of `depth` tokens is accepted (the prefill emits one)."""
    return -(-(new_tokens - 1) // (depth + 1))


@pytest.mark.parametrize("fail_at", [1, 3])
def test_a_drafter_that_raises_fails_the_drafted_check(target, fail_at):
    """The same tokens either way: only the faults tell, at the first call and at a later one."""
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    out = _spec("scripted", target, ScriptedProposer(reference, target.vocab_size, fail_at=fail_at)).generate(
        _requests(PROMPTS), params
    )
    assert [r.tokens for r in out.rows] == reference
    with pytest.raises(AssertionError, match="raised and was turned off"):
        assert_drafted(out.stats)


def test_boundaries_eos_in_a_draft_max_tokens_mid_draft_and_context_end(target, tiny_model_dir):
    same_model = ModelRunner(_load(tiny_model_dir))
    spec = _spec("speculative", target, DraftModelProposer(same_model, target.vocab_size))
    ar = AutoregressiveStrategy(target)
    free = _tokens(ar, PROMPTS, _params(12))
    # EOS = the 6th generated token of row 0: inside the second draft chain.
    eos = frozenset({free[0][5]})
    params = _params(12, eos=eos, ignore_eos=False)
    ar_rows = ar.generate(_requests(PROMPTS), params).rows
    spec_rows = spec.generate(_requests(PROMPTS), params).rows
    assert [r.tokens for r in spec_rows] == [r.tokens for r in ar_rows]
    assert spec_rows[0].finish_reason == FINISH_STOP and spec_rows[0].tokens[-1] in eos
    # max_new_tokens not a multiple of k+1: the last chain is clamped.
    for n in (1, 2, 7):
        assert _tokens(spec, PROMPTS, _params(n)) == _tokens(ar, PROMPTS, _params(n))
    # A prompt 3 tokens short of the context: drafts are clamped to the room left.
    near = [[5] * (target.max_context - 3), [6, 7]]
    rows = spec.generate(_requests(near), _params(30)).rows
    assert [r.tokens for r in rows] == _tokens(ar, near, _params(30))
    assert len(rows[0].tokens) == 3 and rows[0].finish_reason == FINISH_LENGTH


def test_specdec(target, random_draft):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    proposer = DraftModelProposer(random_draft, target.vocab_size)
    exact = _spec("specdec", target, proposer, Relaxed(top_beta=1, tolerance=0.0))
    out = exact.generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    assert_drafted(out.stats, every_step=True)
    # From the same state (one step, the same drafts), β > 1 accepts at least as many tokens...
    one_step = _params(K + 1)
    strict = exact.generate(_requests(PROMPTS), one_step).stats["accepted_tokens"]
    loose = _spec("specdec", target, proposer, Relaxed(top_beta=4, tolerance=3.0))
    assert loose.generate(_requests(PROMPTS), one_step).stats["accepted_tokens"] >= strict
    # ...and strictly more when a draft's token is the target's runner-up: exact matching rejects
    # it, β = 2 accepts it, and the step goes on from there.
    runner_up = RunnerUpProposer(target, PROMPTS, reference)
    relaxed = _spec("specdec", target, runner_up, Relaxed(top_beta=2, tolerance=100.0))
    rows = relaxed.generate(_requests(PROMPTS), _params(3))
    assert rows.stats["accepted_tokens"] == len(PROMPTS)
    pairs = zip(reference, runner_up.tokens, strict=True)
    assert [r.tokens[:2] for r in rows.rows] == [[ref[0], t] for ref, t in pairs]
    exact = _spec("specdec", target, RunnerUpProposer(target, PROMPTS, reference), Relaxed(top_beta=1))
    assert exact.generate(_requests(PROMPTS), _params(3)).stats["accepted_tokens"] == 0
    with pytest.raises(ValueError, match="temperature=0"):
        exact.generate(_requests(PROMPTS), _params(temperature=1.0))


class RunnerUpProposer(ScriptedProposer):
    """Drafts, at its first call, each row's second most likely token after its first greedy one."""

    def __init__(self, target: ModelRunner, prompts: list[list[int]], reference: list[list[int]]):
        super().__init__(reference, target.vocab_size)
        self.tokens = []
        for prompt, ref in zip(prompts, reference, strict=True):
            with torch.inference_mode():
                logits = target.model(torch.tensor([[*prompt, ref[0]]])).logits[0, -1]
            self.tokens.append(int(logits.topk(2).indices[1]))

    def propose(self, context):
        self.calls += 1
        return [Draft.chain([self.tokens[row]] if self.calls == 1 else []) for row in self.rows]


def test_seeded_sampling_is_deterministic_and_independent_of_the_batch(target, random_draft):
    spec = _spec("speculative", target, DraftModelProposer(random_draft, target.vocab_size))
    params = _params(16, temperature=0.8, top_k=40, seed=3)
    first = _tokens(spec, PROMPTS, params)
    assert first == _tokens(spec, PROMPTS, params)
    assert first != _tokens(spec, PROMPTS, _params(16, temperature=0.8, top_k=40, seed=4))
    alone = spec.generate([_requests(PROMPTS)[3]], params).rows[0].tokens
    assert alone == first[3]
    out = spec.generate(_requests(PROMPTS), params)  # speculation ran: no fault turned it off, no draft refused
    assert not out.stats["faults"] and out.stats["fallbacks"] == 0 and out.stats["draft_tokens"] > 0


def test_faults_are_tallied_per_drafter_with_the_first_message():
    batches = [{"draft_model": (1, "verify with draft_model: RuntimeError: a")}, {}]
    batches.append({"draft_model": (2, "proposer draft_model: ValueError: b"), "lookahead": (1, "proposer c")})
    assert tally_faults(batches) == {
        "draft_model": (3, "verify with draft_model: RuntimeError: a"),
        "lookahead": (1, "proposer c"),
    }


class InvalidProposer(ScriptedProposer):
    """Returns out-of-vocabulary ids for the first row."""

    def propose(self, context):
        drafts = super().propose(context)
        drafts[0] = Draft.chain([self.vocab_size + 5])
        return drafts


@pytest.mark.parametrize("mode", ["raise", "invalid"])
def test_proposer_faults_fall_back_to_autoregressive_steps(target, mode):
    params = _params()
    reference = _tokens(AutoregressiveStrategy(target), PROMPTS, params)
    if mode == "raise":
        proposer = ScriptedProposer(reference, target.vocab_size, fail_at=2)
    else:
        proposer = InvalidProposer(reference, target.vocab_size)
    spec = _spec("scripted", target, proposer)
    out = spec.generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == reference
    if mode == "invalid":
        assert out.stats["fallbacks"] > 0
    else:
        assert list(out.stats["faults"]) == ["scripted"] and "proposer scripted" in out.stats["faults"]["scripted"][0]


def test_verify_inputs_and_emitting_logits_on_literal_drafts():
    """Slot 0 is the pending token, slot i+1 node i at `next_pos + depth`; rows right-padded."""
    tree = Draft([10, 11, 12], [-1, -1, 0])
    inputs = verify_inputs([7, 8, 9], [tree, Draft.chain([20]), Draft.empty()], torch.tensor([5, 3, 2]))
    assert inputs.ids.tolist() == [[7, 10, 11, 12], [8, 20, 0, 0], [9, 0, 0, 0]] and inputs.ids.dtype == torch.long
    assert inputs.depths.tolist() == [[0, 1, 1, 2], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert inputs.positions.tolist() == [[5, 6, 6, 7], [3, 4, 3, 3], [2, 2, 2, 2]]
    assert inputs.valid.tolist() == [[True] * 4, [True, True, False, False], [True, False, False, False]]
    assert inputs.attend.tolist() == [
        tree_attention(d.parents, 4).tolist() for d in (tree, Draft.chain([20]), Draft.empty())
    ]
    chains = verify_inputs([7, 8], [Draft.chain([1, 2]), Draft.chain([3])], torch.tensor([0, 4]))
    assert chains.attend is None and chains.positions.tolist() == [[0, 1, 2], [4, 5, 4]]

    logits = torch.arange(6, dtype=torch.float64).reshape(2, 3, 1)  # [B, W, 1]: 3 row + slot
    checked = Verification(
        [Verdict([2], [11, 12]), Verdict([1, 2], [20, 21, 22])],
        states=None,
        logits=logits,
        forward_s=0.0,
        computed_width=3,
    )
    assert checked.emitting_logits()[:, 0].tolist() == [0, 2, 3, 4, 5]


class _ScriptedRule:
    """Hands back verdicts fixed in advance (or raises `error`) and keeps the slot positions it was
    asked about, once registered in `acceptance.ACCEPTORS`. Duck-typed: a subclass of AcceptanceRule
    would join the registry's list of rules."""

    def __init__(self, verdicts, error=None):
        self.verdicts, self.error, self.positions = verdicts, error, None

    def accept(self, logits, drafts, slots, sampling):
        self.positions = slots.positions.tolist()
        if self.error is not None:
            raise self.error
        return self.verdicts


def test_verify_feeds_each_slot_its_ancestry_keeps_the_accepted_path_and_rolls_back_on_error(target, monkeypatch):
    """Logits, not tokens, are compared with a plain forward over each slot's path: a tiny random model's
    argmax barely depends on the context, its logits do."""
    monkeypatch.setitem(ACCEPTORS, _ScriptedRule, lambda rule, *args: rule.accept(*args))
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    kv = target.new_kv(2)
    target.prefill(kv, prompts)
    pending, keys = [20, 21], torch.tensor([0, 1])
    drafts = [Draft([30, 31, 32], [-1, -1, 1]), Draft.chain([33, 34])]  # row 0: 32 below 31; 30 a sibling
    valid, next_pos = kv.valid.clone(), kv.next_pos.clone()
    with pytest.raises(KeyError):  # a rule that refuses leaves every row's cache as it was
        verify(target, kv, pending, drafts, _ScriptedRule(None, KeyError("no")), SamplingParams(), keys, [3, 1])
    assert torch.equal(kv.valid[:, : valid.shape[1]], valid) and not kv.valid[:, valid.shape[1] :].any()
    assert torch.equal(kv.next_pos, next_pos)

    rule = _ScriptedRule([Verdict([2, 3], [31, 32, 40]), Verdict([], [41])])
    checked = verify(target, kv, pending, drafts, rule, SamplingParams(), keys, [3, 1])
    assert rule.positions == [[3, 4, 4, 5], [1, 2, 3, 1]]  # generated + depth; padding at depth 0
    assert checked.states is None and kv.next_pos.tolist() == [next_pos[0] + 3, next_pos[1] + 1]

    def reference(tokens):
        return target.model(torch.tensor([tokens])).logits[0, -1]

    paths = {
        (0, 0): [20],
        (0, 1): [20, 30],
        (0, 2): [20, 31],
        (0, 3): [20, 31, 32],
        (1, 1): [21, 33],
        (1, 2): [21, 33, 34],
    }
    for (row, slot), path in paths.items():
        assert torch.allclose(checked.logits[row, slot], reference(prompts[row] + path), atol=1e-10)
    # The next step sees each row's accepted path and nothing it rejected.
    ids = torch.tensor([[40], [41]])
    logits = target.forward(kv, ids, kv.next_pos[:, None], torch.ones_like(ids, dtype=torch.bool)).logits[:, -1]
    assert torch.allclose(logits[0], reference(prompts[0] + [20, 31, 32, 40]), atol=1e-10)
    assert torch.allclose(logits[1], reference(prompts[1] + [21, 41]), atol=1e-10)

    one = target.new_kv(1)
    target.prefill(one, [prompts[1]])
    args = ([21], [Draft.chain([33])], _ScriptedRule([Verdict([1], [33, 42])]), SamplingParams(), keys[:1], [1])
    asked = verify(target, one, *args, want_hidden=True)
    assert asked.states.kept == [[0, 1]] and asked.states.hidden.shape[:2] == (1, 2)
    assert torch.equal(asked.states.logits, asked.logits)
    assert verify(target, one, *args, want_logits=True).states.hidden is None

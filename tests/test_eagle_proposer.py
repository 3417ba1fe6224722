"""The EAGLE proposer (`strategies/proposers/eagle.py`): what it feeds its head, where, and what it keeps;
each test names the mutants it kills."""

from __future__ import annotations

import pytest
import torch
from test_eagle import tiny_eagle
from transformers import AutoModelForCausalLM

from strategies.base import GenerationParams
from strategies.proposers.eagle import EagleProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.runtime.target_states import TargetStates
from strategies.verification.proposer import ProposalContext

CONTEXTS = [[5, 17, 3, 88, 41, 9], [23, 7, 71], [11, 54, 2, 96, 30, 4, 60]]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


class RootTracing(EagleProposer):
    """Keeps the root feature each proposal predicted for each row."""

    def _feed_target_features(self):
        self.root = super()._feed_target_features().clone()
        return self.root


def _final_states(target: ModelRunner, tokens: list[int]) -> torch.Tensor:
    """[T, H] the target's final-norm states over `tokens` by a plain forward."""
    with torch.inference_mode():
        return target.model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]


def _prefill_states(target: ModelRunner, contexts: list[list[int]]) -> TargetStates:
    """What a prefill of each context but its pending token hands the proposer: every position kept."""
    states = [_final_states(target, c[:-1]) for c in contexts]
    width = max(len(s) for s in states)
    hidden = torch.zeros(len(states), width, states[0].shape[1], dtype=torch.float64)
    for b, s in enumerate(states):
        hidden[b, : len(s)] = s
    return TargetStates(hidden, [list(range(len(s))) for s in states])


def _root(target: ModelRunner, head, context: list[int]) -> torch.Tensor:
    """The head's causal pass over the whole context: (f_t, token t+1) at t, the pending token last."""
    features = _final_states(target, context[:-1])[None]
    tokens = torch.tensor([context[1:]])
    with torch.inference_mode():
        return head(features, tokens, torch.arange(tokens.shape[1])[None])[0, -1]


def _context(budgets: list[int], max_nodes: int = 4) -> ProposalContext:
    return ProposalContext([1] * len(budgets), budgets, max_nodes, torch.zeros(len(budgets)))


def _params(**sampling) -> GenerationParams:
    return GenerationParams(16, SamplingParams(**sampling), eos_token_ids=frozenset(), ignore_eos=True)


def test_kept_and_joining_rows_draft_from_a_root_of_their_whole_context(target, tiny_model_dir):
    """Kills `keep_rows` selecting other rows of the head's cache, `add_rows` giving a joining row
    another row's features (or none) or not extending the cache, and `emitted` not queueing each row's
    own new features or recording its verdicts under another depth: after a plain step, rows finishing
    and a row joining, every root is the head's causal pass over its row's whole context."""
    head = tiny_eagle(target, tiny_model_dir)
    proposer = RootTracing(head, top_k=1)
    proposer.start([list(c) for c in CONTEXTS[:2]], _params(), _prefill_states(target, CONTEXTS[:2]))
    proposer.propose(_context([3, 3]))
    for b, context in enumerate(CONTEXTS[:2]):
        assert torch.allclose(proposer.root[b], _root(target, head, context), atol=1e-9)
    # A step where the target rejected each draft at once: each row keeps its pending token's state.
    pending_states = torch.stack([_final_states(target, c)[-1] for c in CONTEXTS[:2]])[:, None]
    proposer.emitted([[8], [6]], TargetStates(pending_states, [[0], [0]]))
    assert {depth for depth, _, _ in proposer.calibration.counts} == {1}  # each row's depth-1 node judged
    contexts = [[*CONTEXTS[0], 8], [*CONTEXTS[1], 6]]
    proposer.keep_rows([1])
    proposer.add_rows([list(CONTEXTS[2])], _prefill_states(target, CONTEXTS[2:]))
    proposer.propose(_context([3, 3]))
    for b, context in enumerate([contexts[1], CONTEXTS[2]]):
        assert torch.allclose(proposer.root[b], _root(target, head, context), atol=1e-9), b


def test_a_step_without_budget_drafts_nothing_and_a_proposer_without_states_says_what_it_needs(target, tiny_model_dir):
    """Kills `propose` growing a tree where no row may draft (depth 0), and `_kept_features` accepting a
    step without the target's states."""
    proposer = EagleProposer(tiny_eagle(target, tiny_model_dir), top_k=2)
    proposer.start([list(CONTEXTS[0])], _params(), _prefill_states(target, CONTEXTS[:1]))
    assert [d.tokens for d in proposer.propose(_context([0]))] == [[]]
    needs = r"^the EAGLE proposer drafts from the target's features: it needs them after every forward$"
    with pytest.raises(ValueError, match=needs):
        proposer.emitted([[3]], None)


def test_a_head_loaded_for_inference_alone_is_fused_and_drafts(target, tiny_model_dir):
    """Kills `_fused_weights` reading the version counter of inference tensors (which keep none): a head
    whose parameters were made under `torch.inference_mode` is fused once, and drafts."""
    with torch.inference_mode():
        head = tiny_eagle(target, tiny_model_dir)
    assert all(p.is_inference() for p in head.parameters())
    proposer = EagleProposer(head, top_k=1)
    proposer.start([list(CONTEXTS[0])], _params(), _prefill_states(target, CONTEXTS[:1]))
    assert len(proposer.propose(_context([2]))[0].tokens) == 2


def test_a_proposal_leaves_the_heads_cache_as_it_found_it_but_for_the_true_features(target, tiny_model_dir):
    """Kills `_grow` truncating the head's cache to anything but its slot count before the tree (the tree's
    nodes stay in its layer, or `next_pos` moves past them), and `new_row_state` starting a row's features
    in another shape, dtype or device than the head's: a joining row's features are that empty start
    joined to the target's."""
    head = tiny_eagle(target, tiny_model_dir)
    proposer = EagleProposer(head, top_k=2)
    proposer.start([list(c) for c in CONTEXTS[:2]], _params(), _prefill_states(target, CONTEXTS[:2]))
    fed = [len(c) - 1 for c in CONTEXTS[:2]]  # the true features each row feeds its head
    proposer.propose(_context([3, 3]))
    kv = proposer.kv
    assert kv.num_slots == max(fed) and kv.next_pos.tolist() == fed
    assert kv.valid.sum(dim=1).tolist() == fed and kv.layers[0].keys.shape[2] == kv.num_slots
    empty = proposer.new_row_state([1, 2]).features
    assert empty.shape == (0, head.config.hidden_size) and empty.dtype == head.fc.weight.dtype == torch.float64
    assert empty.device == head.fc.weight.device


def test_rows_and_their_emitted_tokens_must_pair_up(target, tiny_model_dir):
    """Kills `emitted` zipping the rows with their tokens, or the judged nodes with them, without
    `strict`: a caller that hands another number of rows than the proposer holds is told, rather than
    the rows past the shorter list silently keeping stale contexts and verdicts."""
    proposer = EagleProposer(tiny_eagle(target, tiny_model_dir), top_k=2)
    proposer.start([list(c) for c in CONTEXTS[:2]], _params(), _prefill_states(target, CONTEXTS[:2]))
    one_state = TargetStates(torch.zeros(1, 1, proposer.head.config.hidden_size, dtype=torch.float64), [[0]])
    with pytest.raises(ValueError, match="zip"):
        proposer.emitted([[3]], one_state)
    proposer.propose(_context([3, 3]))  # a dynamic tree at temperature 0: its nodes wait for their verdicts
    assert proposer._offered is not None and len(proposer._offered) == 2
    proposer.rows = proposer.rows[:1]  # the rows paired, the judged nodes not
    with pytest.raises(ValueError, match="zip"):
        proposer.emitted([[3]], one_state)

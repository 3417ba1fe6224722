"""The draft-model proposer (`strategies/proposers/draft_model.py`) on a scripted draft model: what it feeds,
where, and what it keeps of its cache; each test names the mutants it kills."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from strategies.base import GenerationParams
from strategies.proposers.draft_model import DraftModelProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import STREAM_DRAFT, SamplingParams, filtered_probs, keyed_uniform, sample_from
from strategies.verification.proposer import ProposalContext

CONTEXTS = [[5, 17, 3, 88, 41, 9, 60], [23, 7, 71], [11, 54, 2, 96, 30]]


@pytest.fixture(scope="module")
def draft(tiny_model_dir):
    """The tiny random Llama with sharpened, loud attention (as `test_context_model`'s target): its next
    token depends on its whole context, so a dropped slot or a wrong position changes it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
            layer.self_attn.k_proj.weight.mul_(10.0)
            layer.self_attn.o_proj.weight.mul_(30.0)
    return ModelRunner(model)


def _logits(draft: ModelRunner, tokens: list[int]) -> torch.Tensor:
    """[V] the draft's next-token logits after `tokens`, by a plain forward over them."""
    with torch.inference_mode():
        return draft.model(torch.tensor([tokens])).logits[0, -1]


def _greedy(draft: ModelRunner, context: list[int], n: int) -> list[int]:
    tokens = list(context)
    for _ in range(n):
        tokens.append(int(_logits(draft, tokens).argmax()))
    return tokens[len(context) :]


def _params(eos=frozenset(), ignore_eos=True, **sampling) -> GenerationParams:
    return GenerationParams(64, SamplingParams(**sampling), eos_token_ids=eos, ignore_eos=ignore_eos)


def _context(budgets: list[int], generated: list[int]) -> ProposalContext:
    return ProposalContext(generated, budgets, max(budgets), torch.arange(len(budgets)))


def test_every_draft_is_the_drafts_greedy_continuation_of_the_rows_whole_context(draft):
    """Kills a draft fed from the wrong position or with a stale cache: `propose` feeding other than the
    tokens since `fed`, at positions other than `next_pos` onward, reading the logits of another than
    each row's last fed token, recording fed slots or the next position wrong; `emitted` keeping
    rejected drafts in the cache (`fed_slots[kept:]` off by one, `accepted = len(tokens)`), advancing
    `fed` wrong, or skipping the contexts of a step without drafts; `new_row_state` feeding the
    pending token twice or never; `keep_rows` selecting other rows; a row's budget ignored. Each step
    accepts a different share of each row's draft, some rows draft nothing, and rows finish."""
    proposer = DraftModelProposer(draft, draft.vocab_size)
    contexts = [list(c) for c in CONTEXTS]
    proposer.start([list(c) for c in contexts], _params(), None)
    generated = [1, 1, 1]
    # Per step: each row's budget, and how many of its draft's tokens the "target" accepts.
    script = [([3, 2, 4], [1, 2, 0]), ([2, 0, 3], [2, 0, 3]), ([0, 0, 0], [0, 0, 0]), ([4, 3, 1], [0, 3, 1])]
    for budgets, accepted in script:
        drafts = proposer.propose(_context(budgets, generated))
        for row, (context, budget) in enumerate(zip(contexts, budgets, strict=True)):
            assert drafts[row].tokens == _greedy(draft, context, budget), (budgets, row)
            assert drafts[row].parents == list(range(-1, budget - 1))
        emitted = []
        for d, a in zip(drafts, accepted, strict=True):
            # The target's own token: not the draft's next one (that would have been accepted).
            own = next(t for t in (1, 2) if d.tokens[a : a + 1] != [t])
            emitted.append([*d.tokens[:a], own])
        proposer.emitted(emitted, None)
        for context, tokens in zip(contexts, emitted, strict=True):
            context.extend(tokens)
        generated = [g + len(tokens) for g, tokens in zip(generated, emitted, strict=True)]
    proposer.keep_rows([2, 0])
    contexts, generated = [contexts[2], contexts[0]], [generated[2], generated[0]]
    drafts = proposer.propose(_context([3, 2], generated))
    assert [d.tokens for d in drafts] == [_greedy(draft, contexts[0], 3), _greedy(draft, contexts[1], 2)]


def test_a_draft_stops_at_an_end_of_sequence_token_unless_the_row_ignores_it(draft, monkeypatch):
    """Kills drafting on past an end-of-sequence token (`chosen in eos` as `not in`), or stopping at one
    the row ignores; a row's drafting stopping before its budget (`>=` as `>`); and draft forwards run
    after every row has stopped (`or` as `and`) or past the last depth (`steps - 1` as `steps + 1`):
    the pending token's forward, then one per drafted token but the last."""
    forwards = []
    forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda *args, **kwargs: forwards.append(1) or forward(*args, **kwargs))
    greedy = _greedy(draft, CONTEXTS[0], 4)
    eos = frozenset({greedy[1]})
    proposer = DraftModelProposer(draft, draft.vocab_size)
    proposer.start([list(CONTEXTS[0])], _params(eos=eos, ignore_eos=False), None)
    forwards.clear()
    assert proposer.propose(_context([4], [1]))[0].tokens == greedy[:2]
    assert len(forwards) == 2
    proposer = DraftModelProposer(draft, draft.vocab_size)
    proposer.start([list(CONTEXTS[0])], _params(eos=eos, ignore_eos=True), None)
    forwards.clear()
    assert proposer.propose(_context([4], [1]))[0].tokens == greedy
    assert len(forwards) == 4


def test_sampled_drafts_are_keyed_samples_of_the_drafts_filtered_distribution(draft):
    """Kills sampled drafting from the wrong distribution or uniform: the draft probabilities not the
    filtered ones at each depth, a depth's uniform keyed at other than `generated + i` or another
    stream, probabilities kept for the wrong tokens (`probs` appended on a greedy step or for a row
    that stopped)."""
    params = _params(temperature=0.9, top_k=20, seed=5)
    proposer = DraftModelProposer(draft, draft.vocab_size)
    proposer.start([list(c) for c in CONTEXTS], params, None)
    budgets, generated = [3, 1, 2], [4, 2, 7]
    drafts = proposer.propose(_context(budgets, generated))
    for row, (context, budget) in enumerate(zip(CONTEXTS, budgets, strict=True)):
        tokens = list(context)
        for i in range(budget):
            q = filtered_probs(_logits(draft, tokens)[None], params.sampling)  # [1, V]
            u = keyed_uniform(5, torch.tensor([row]), torch.tensor([generated[row] + i]), STREAM_DRAFT)
            tokens.append(int(sample_from(q, u)[0]))
            assert torch.allclose(drafts[row].probs[i], q[0])
        assert drafts[row].tokens == tokens[len(context) :]
        assert drafts[row].probs.shape[0] == budget


def test_draft_logits_are_cut_or_padded_to_the_targets_vocabulary(draft):
    """Kills `_logits` cutting a larger draft vocabulary at another width or padding a smaller one with
    other than the dtype's lowest value (a padded token could then be drafted)."""
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0]], dtype=torch.float64)
    assert DraftModelProposer(draft, 3)._logits(logits).tolist() == [[0.5, -1.0, 2.0]]
    assert DraftModelProposer(draft, 4)._logits(logits).tolist() == logits.tolist()
    lowest = torch.finfo(torch.float64).min
    assert DraftModelProposer(draft, 6)._logits(logits).tolist() == [[0.5, -1.0, 2.0, 0.0, lowest, lowest]]


def test_rows_that_join_mid_batch_draft_from_their_own_whole_context(draft):
    """Kills `add_rows` not prefilling the joining rows' draft cache (or prefilling other contexts), and
    not making their records: continuous batching adds rows to a running batch."""
    proposer = DraftModelProposer(draft, draft.vocab_size)
    proposer.start([list(CONTEXTS[0])], _params(), None)
    first = proposer.propose(_context([2], [1]))[0].tokens
    proposer.emitted([[*first, 1]], None)
    proposer.add_rows([list(CONTEXTS[1]), list(CONTEXTS[2])], None)
    drafts = proposer.propose(_context([3, 2, 3], [4, 1, 1]))
    contexts = [[*CONTEXTS[0], *first, 1], CONTEXTS[1], CONTEXTS[2]]
    assert [d.tokens for d in drafts] == [_greedy(draft, c, n) for c, n in zip(contexts, (3, 2, 3), strict=True)]

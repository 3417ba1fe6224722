"""Retrieval drafting: the n-gram index and the trie on literal sequences; greedy equivalence; trees."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bigram_model import argmax_table, bigram_model
from drafted import assert_drafted
from transformers import AutoModelForCausalLM

from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.proposers.draft_sizing import AcceptanceRecord, linear_step_costs
from strategies.proposers.lookahead import LookaheadProposer, TokenTrie, gather_tree
from strategies.proposers.prompt_lookup import NgramIndex, PromptLookupProposer
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.drafting import DraftingMethod
from strategies.verification.drafts import Draft, merge_drafts, tree_attention, tree_depths
from strategies.verification.proposer import ProposalContext
from strategies.verification.speculative import SpeculativeStrategy


def test_ngram_index_prefers_the_longest_then_latest_match():
    index = NgramIndex([1, 2, 3, 9, 1, 2, 4, 7, 2], min_n=1, max_n=3)
    assert index.continuation(3) == [4, 7, 2]  # suffix [2]: latest earlier 2 is at index 5
    index.extend([3])  # suffix [2, 3] matches at 1: continuation 9, 1, 2
    assert index.continuation(3) == [9, 1, 2]
    assert NgramIndex([5, 6, 7], 1, 3).continuation(4) == []  # nothing repeats
    index.extend([8])
    assert index.continuation(2) == []


def test_trie_insert_find_and_best_first_gather():
    trie = TokenTrie(depth=4, max_nodes=1000)
    trie.insert([1, 2, 3, 4, 1, 2, 5], range(7))  # outputs: counted globally
    assert trie.find([1, 2]).freq == 2 and trie.find([2, 3, 4, 1]).freq == 1 and trie.find([3, 1]) is None
    draft = gather_tree(trie.find([1]), row=0, own_weight=1.0, max_nodes=3, max_depth=2, mode="hier")
    assert draft.tokens[0] == 2 and draft.parents[0] == -1  # "2" follows "1" twice
    assert sorted(zip(draft.tokens[1:], draft.parents[1:], strict=True)) == [(3, 0), (5, 0)]
    one = gather_tree(trie.find([1]), row=0, own_weight=1.0, max_nodes=8, max_depth=3, mode="one")
    assert one.tokens == [2, 3, 4] and one.parents == [-1, 0, 1]


def test_own_prompt_counts_more_and_leaves_with_its_row():
    trie = TokenTrie(depth=3, max_nodes=1000)
    trie.insert([7, 1], range(2), row=10)  # row 10's prompt: 7 -> 1
    trie.insert([7, 2], range(2), row=11)  # row 11's prompt: 7 -> 2
    trie.insert([7, 2], range(2))  # an output: 7 -> 2
    pick = gather_tree(trie.find([7]), row=10, own_weight=3.0, max_nodes=1, max_depth=1, mode="hier")
    assert pick.tokens == [1]  # own prompt (3 x 1) beats output + other prompt (1 + 1)
    trie.release(10)
    assert trie.find([7, 1]).prompt_total == 0
    assert gather_tree(trie.find([7]), row=11, own_weight=3.0, max_nodes=1, max_depth=1, mode="hier").tokens == [2]


def test_pruning_keeps_the_trie_under_its_cap_and_keeps_live_prompts():
    trie = TokenTrie(depth=3, max_nodes=30, decay=0.5)
    trie.insert([1, 2, 3], range(3), row=5)
    for start in range(0, 200, 7):
        trie.insert(list(range(100 + start, 110 + start)), range(10))
    assert trie.num_nodes <= 30
    assert trie.find([1, 2, 3]) is not None  # held by an active prompt
    trie.release(5)
    trie.insert(list(range(500, 540)), range(40))
    assert trie.num_nodes <= 30 and trie.find([1, 2, 3]) is None


def test_lookahead_retrieves_the_longest_suffix_first():
    proposer = LookaheadProposer(decoding_length=1, branch_length=2, max_query_length=3)
    context = [1, 2, 3, 4, 9, 3, 5, 5, 9, 3, 5, 5, 2, 3]  # prompt, then the pending token 3
    proposer.start([context], None, None)
    # The context ends 5, 2, 3: [5, 2, 3] is unknown; [2, 3] was followed by 4 (once) — taken over
    # the bare [3], which was followed by 5 twice.
    keys = torch.zeros(1, dtype=torch.long)
    draft = proposer.propose(ProposalContext(num_generated=[1], budgets=[2], max_nodes=1, keys=keys))[0]
    assert draft.tokens == [4]
    proposer.emitted([[4, 6]], None)  # context now ends ... 3, 4, 6: [6] is unknown, nothing to draft
    assert proposer.propose(ProposalContext(num_generated=[3], budgets=[2], max_nodes=1, keys=keys))[0].tokens == []


def test_lookahead_reports_the_counting_a_row_needs_once_as_setup_not_as_its_steps_cost():
    """A row's prompt is counted at its first proposal: that time is `setup_s`, which the loop leaves out
    of the step the controller measures, as it does a start. A proposal with nothing new to count has none."""
    proposer = LookaheadProposer(decoding_length=4, branch_length=2, max_query_length=2)
    proposer.start([list(range(2, 400))], None, None)
    keys = torch.zeros(1, dtype=torch.long)
    context = ProposalContext(num_generated=[1], budgets=[2], max_nodes=4, keys=keys)
    proposer.propose(context)
    assert proposer.setup_s > 0.0 and proposer.trie.num_nodes > 0
    proposer.emitted([[5]], None)
    proposer.propose(context)
    assert proposer.setup_s == 0.0


def test_lookahead_counts_nothing_until_it_proposes_and_then_what_an_eager_count_would_hold():
    """Prompts and finished outputs are counted at the next proposal: a batch decoded with Lookahead off
    costs no trie work, and the proposal after it reads the counts made at once would have left."""
    proposer = LookaheadProposer(decoding_length=4, branch_length=2, max_query_length=2)  # trie depth 4
    proposer.start([[1, 2, 3], [4, 5]], None, None)
    proposer.emitted([[6, 7, 8, 9], [5, 4]], None)
    proposer.keep_rows([1])  # row 0 finished: its output waits; its prompt was never counted
    assert proposer.trie.num_nodes == 0 and list(proposer.pending) == [[1, 2, 3, 6, 7, 8, 9]]

    eager = TokenTrie(depth=4, max_nodes=proposer.trie.max_nodes)  # each count made when it happened:
    eager.insert([1, 2, 3], range(3), row=0)  # the rows' prompts as they start
    eager.insert([4, 5], range(2), row=1)
    eager.insert(
        [1, 2, 3, 6, 7, 8, 9], range(7)
    )  # row 0's output substrings (from its first that reaches past its prompt) as it finishes
    eager.release(0)
    eager.insert([4, 5, 5, 4], range(1))  # row 1's whole output substrings, at the proposal
    keys = torch.zeros(1, dtype=torch.long)
    draft = proposer.propose(ProposalContext(num_generated=[3], budgets=[2], max_nodes=4, keys=keys))[0]

    def counts(node, path=()):
        yield path, node.freq, node.prompt_total
        for token, child in sorted(node.children.items()):
            yield from counts(child, (*path, token))

    assert list(counts(proposer.trie.root)) == list(counts(eager.root)) and not proposer.pending
    # Row 1's context ends 5, 4: [5, 4] is unknown, [4] was followed by 5 (its prompt and its output), then 5.
    assert (draft.tokens, draft.parents) == ([5, 5], [-1, 0])


def test_merged_drafts_keep_the_first_whole_then_the_seconds_new_paths_while_there_is_room():
    chain = Draft.chain([4, 0, 7])
    tree = Draft([4, 3, 9, 1, 5], [-1, -1, 0, 1, 3])  # 4 -> 9; 3 -> 1 -> 5
    merged = merge_drafts(chain, tree, max_nodes=6)
    # 4 is the chain's first node; 3 is new, 9 hangs below the chain's 4, 1 below 3; 5 finds no room.
    assert (merged.tokens, merged.parents) == ([4, 0, 7, 3, 9, 1], [-1, 0, 1, -1, 0, 3])
    assert tree_depths(merged.parents) == [0, 1, 2, 3, 1, 2, 2]
    cut = merge_drafts(chain, tree, max_nodes=4)  # room for the second's first new node only
    assert (cut.tokens, cut.parents) == ([4, 0, 7, 3], [-1, 0, 1, -1])
    same = merge_drafts(chain, Draft.chain([4, 0]), max_nodes=3)  # paths already there need no room
    assert (same.tokens, same.parents) == (chain.tokens, chain.parents)
    alone = merge_drafts(Draft.empty(), tree, max_nodes=8)
    assert (alone.tokens, alone.parents) == (tree.tokens, tree.parents)


def test_lookahead_drafts_prompt_lookups_chain_and_fills_the_budget_from_the_trie():
    """Row 0's suffix [1, 2] last occurred before 4, 0 (prompt lookup's copy) but was followed by 3 twice
    (the trie's count): its draft holds both. Row 1's last token 5 never occurred in its own context,
    so its draft is the trie's alone (the trie holds row 0's prompt). The lookup's rows follow the
    batch's as rows finish."""
    contexts = [[1, 2, 3, 1, 2, 3, 1, 2, 4, 0, 5, 6, 1, 2], [7, 5]]
    keys = torch.zeros(2, dtype=torch.long)
    context = ProposalContext(num_generated=[1, 1], budgets=[2, 2], max_nodes=4, keys=keys)

    def proposer(lookup: PromptLookupProposer | None) -> LookaheadProposer:
        made = LookaheadProposer(decoding_length=4, branch_length=2, max_query_length=2, lookup=lookup)
        made.start([list(c) for c in contexts], None, None)
        return made

    trie_alone = proposer(None).propose(context)
    assert trie_alone[0].tokens[:2] == [3, 1] and trie_alone[1].tokens[0] == 6
    both = proposer(PromptLookupProposer(min_ngram=1, max_ngram=3))
    drafts = both.propose(context)
    expected = merge_drafts(Draft.chain([4, 0]), trie_alone[0], max_nodes=4)  # the chain cut to the budget of 2
    assert (drafts[0].tokens, drafts[0].parents) == (expected.tokens, expected.parents)
    assert drafts[0].tokens[:3] == [4, 0, 3]
    assert (drafts[1].tokens, drafts[1].parents) == (trie_alone[1].tokens, trie_alone[1].parents)
    full = both.propose(dataclasses.replace(context, max_nodes=2))[0]  # the chain fills the node budget
    assert (full.tokens, full.parents) == ([4, 0], [-1, 0])

    both.emitted([[4, 0, 5], [6]], None)
    both.keep_rows([1])
    assert [row.index.tokens for row in both.lookup.rows] == [row.context for row in both.rows] == [[7, 5, 6]]


def test_lookahead_keeps_only_the_latest_outputs_while_it_does_not_propose():
    proposer = LookaheadProposer(decoding_length=4, branch_length=2, max_query_length=2, max_nodes=5)
    for first in range(0, 30, 3):  # ten rows one after another, none proposing
        proposer.start([[100]], None, None)
        proposer.emitted([[first, first + 1, first + 2]], None)
        proposer.keep_rows([])
    assert list(proposer.pending) == [[100, 27, 28, 29]]  # at most max_nodes tokens wait, the latest


PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],  # repetitive: retrieval finds a lot
    [13],  # nothing to retrieve
    [14, 15, 16, 14, 15],
    [17, 18, 19, 20, 21, 22],
    [23, 24],
    [25] * 11,
    [26, 27, 26],
    [28, 29, 30, 31, 28, 29],
]


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def _strategies(runner):
    yield SpeculativeStrategy(
        "prompt_lookup", runner, [DraftingMethod("prompt_lookup", PromptLookupProposer(1, 3), 4, 4)]
    )
    # Sized by acceptance, with drafts so cheap that every kind drafts, then so dear that only kinds
    # accepted at least half the time do (and refused kinds probe).
    for cost in (0.0, 0.6):
        sized = PromptLookupProposer(1, 3, AcceptanceRecord(probe_every=3), linear_step_costs(1.0 + cost, cost, 8))
        yield SpeculativeStrategy("prompt_lookup", runner, [DraftingMethod("prompt_lookup", sized, 8, 8)])
    for mode in ("hier", "one"):
        for lookup in (None, PromptLookupProposer(1, 3)):  # the trie alone, and prompt lookup first
            proposer = LookaheadProposer(12, 4, 4, mode=mode, lookup=lookup)
            yield SpeculativeStrategy("lookahead", runner, [DraftingMethod("lookahead", proposer, 4, 12)])


@pytest.mark.parametrize("batch", [1, 8])
def test_retrieval_strategies_equal_greedy(runner, batch):
    params = GenerationParams(30, SamplingParams(), frozenset(), ignore_eos=True)
    requests = [RowRequest(p, i) for i, p in enumerate(PROMPTS[:batch])]
    reference = [r.tokens for r in AutoregressiveStrategy(runner).generate(requests, params).rows]
    for strategy in _strategies(runner):
        for _ in range(2):  # the second pass runs on a warm trie
            out = strategy.generate(requests, params)
            assert [r.tokens for r in out.rows] == reference, strategy.name
        assert_drafted(out.stats)


@pytest.mark.parametrize("batch", [1, 3])
def test_retrieval_drafts_a_cycle_whole_at_every_step(batch):
    """A target that cycles through its vocabulary repeats its prompt: every draft is the continuation,
    so each row takes its fewest verify steps and plain steps are none. A drafter that raises or stops
    drafting falls below both."""
    vocab, depth, new_tokens = 8, 4, 24
    cycle = ModelRunner(bigram_model(argmax_table([(t + 1) % vocab for t in range(vocab)])))
    prompts = [[*range(vocab), 0, 1], [3, 4, 5, 6, 7, 0, 1, 2, 3], [6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0]][:batch]
    requests = [RowRequest(p, i) for i, p in enumerate(prompts)]
    params = GenerationParams(new_tokens, SamplingParams(), frozenset(), ignore_eos=True)
    reference = [[(p[-1] + 1 + i) % vocab for i in range(new_tokens)] for p in prompts]
    for strategy in (
        SpeculativeStrategy(
            "prompt_lookup", cycle, [DraftingMethod("prompt_lookup", PromptLookupProposer(1, 3), 4, 4)]
        ),
        SpeculativeStrategy("lookahead", cycle, [DraftingMethod("lookahead", LookaheadProposer(12, 4, 4), 4, 12)]),
    ):
        out = strategy.generate(requests, params)
        assert [r.tokens for r in out.rows] == reference, strategy.name
        assert_drafted(out.stats, every_step=True, tau_at_least=depth)
        assert sum(out.stats["verify_steps"].values()) == batch * -(-(new_tokens - 1) // (depth + 1))


def test_retrieval_sampling_equals_autoregressive_sampling(runner):
    """Deterministic drafts verified by the target's own keyed draws emit exactly its samples."""
    params = GenerationParams(20, SamplingParams(temperature=0.9, top_k=30, seed=5), frozenset(), ignore_eos=True)
    requests = [RowRequest(p, i) for i, p in enumerate(PROMPTS)]
    reference = [r.tokens for r in AutoregressiveStrategy(runner).generate(requests, params).rows]
    for strategy in _strategies(runner):
        assert [r.tokens for r in strategy.generate(requests, params).rows] == reference


def test_tree_logits_equal_sequential_logits_for_every_branch(runner):
    prompt = [5, 6, 7, 8]
    # pending 9; branches 9 -> 10 -> 11, 9 -> 12, 9 -> 10 -> 13
    tokens, parents = [10, 12, 11, 13], [-1, -1, 0, 0]
    kv = runner.new_kv(1)
    runner.prefill(kv, [prompt])
    depth = torch.tensor([tree_depths(parents)])
    ids = torch.tensor([[9, *tokens]])
    out = runner.forward(
        kv, ids, kv.next_pos[:, None] + depth, torch.ones_like(ids, dtype=torch.bool), tree_attention(parents, 5)[None]
    )
    branches = {1: [9, 10], 2: [9, 12], 3: [9, 10, 11], 4: [9, 10, 13], 0: [9]}
    for slot, path in branches.items():
        sequential = runner.model(torch.tensor([prompt + path])).logits[0, -1]
        assert torch.allclose(out.logits[0, slot], sequential, atol=1e-10), slot

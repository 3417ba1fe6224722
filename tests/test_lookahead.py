"""Lookahead's trie, its trees and its proposer (`strategies/proposers/lookahead.py`) on literal token lists;
each test names the mutants it kills."""

from __future__ import annotations

import pytest
import torch

from strategies.proposers.lookahead import LookaheadProposer, TokenTrie, _Node, gather_tree
from strategies.proposers.prompt_lookup import PromptLookupProposer
from strategies.verification.proposer import ProposalContext


def _context(budgets: list[int], max_nodes: int) -> ProposalContext:
    return ProposalContext([1] * len(budgets), budgets, max_nodes, torch.zeros(len(budgets)))


def _trie(*outputs: list[int], depth: int = 4) -> TokenTrie:
    trie = TokenTrie(depth=depth, max_nodes=1000)
    for output in outputs:
        trie.insert(output, range(len(output)))
    return trie


def test_a_nodes_score_counts_its_rows_own_prompt_own_weight_times():
    """Kills `_Node.score` other than outputs + every prompt's count - the row's own + own_weight x own."""
    node = _Node()
    node.freq, node.prompt, node.prompt_total = 2.0, {1: 3, 2: 1}, 4
    assert node.score(1, 3.0) == 12.0  # 2 + 4 - 3 + 9
    assert node.score(2, 3.0) == 8.0
    assert node.score(7, 3.0) == 6.0


def test_counting_substrings_counts_each_prefix_once_per_start_up_to_the_depth():
    """Kills `_count` counting past `depth` tokens, a new node not counted in `num_nodes`, an output counted
    as a prompt or a prompt's count not kept per row (so `release` could not take it back)."""
    trie = TokenTrie(depth=2, max_nodes=1000)
    trie.insert([1, 2, 1, 2, 3], range(5))
    assert trie.num_nodes == 6  # 1, 1-2, 2, 2-1, 2-3, 3
    assert [trie.find(s).freq for s in ([1], [1, 2], [2], [2, 1], [2, 3], [3])] == [2.0, 2.0, 2.0, 1.0, 1.0, 1.0]
    assert trie.find([1, 2, 1]) is None
    trie.insert([1, 2], range(2), row=4)
    trie.insert([1], range(1), row=5)
    assert (trie.find([1]).prompt, trie.find([1]).prompt_total, trie.find([1]).freq) == ({4: 1, 5: 1}, 2, 2.0)
    trie.release(4)
    assert (trie.find([1]).prompt, trie.find([1]).prompt_total, trie.find([1, 2]).prompt_total) == ({5: 1}, 1, 0)
    trie.release(4)  # twice: nothing more to release
    assert trie.find([1]).prompt_total == 1


def test_pruning_decays_output_counts_and_drops_what_falls_below_one_until_ten_percent_under_the_cap():
    """Kills `prune` aiming at other than 90% of the cap, `_decay_and_drop` decaying by other than `decay`,
    dropping a node that still has children, a prompt count or a count of at least 1, or keeping one below."""
    trie = TokenTrie(depth=1, max_nodes=10, decay=0.5)
    for token in range(10):
        trie.insert([token] * (1 + token % 3), range(1 + token % 3))  # counts 1, 2, 3, 1, 2, 3, ...
    trie.insert([20], range(1), row=0)  # the 11th node: prune to 9
    assert trie.num_nodes == 7  # the four counted once fall to 0.5 and go; the prompt's node stays
    assert sorted(trie.root.children) == [1, 2, 4, 5, 7, 8, 20]
    assert [trie.root.children[t].freq for t in (1, 2)] == [1.0, 1.5]
    deep = TokenTrie(depth=2, max_nodes=3, decay=0.5)
    deep.insert([1, 2], range(1))
    deep.insert([1, 2], range(1))
    deep.insert([3, 4], range(1))  # 4 nodes: one pass decays all to 1.0 or 0.5, drops 3-4 then 3
    assert deep.num_nodes == 2 and deep.find([1, 2]).freq == 1.0


def test_a_hierarchical_tree_gathers_the_best_continuations_first_within_its_depth():
    """Kills `gather_tree`'s best-first order (scores not negated, ties not by insertion), a child's
    parent other than its node's index in the draft, depth other than 1 below the start and + 1 a level,
    gathering past `max_depth` or `max_nodes`."""
    trie = _trie([1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 6], [1, 5, 6], [1, 7])
    start = trie.find([1])
    draft = gather_tree(start, row=0, own_weight=1.0, max_nodes=5, max_depth=2, mode="hier")
    # 1 -> 2 (3), 5 (3), 7 (1); 1-2 -> 3 (2), 4 (1); 1-5 -> 6 (3): ties keep the first inserted.
    assert (draft.tokens, draft.parents) == ([2, 5, 6, 3, 7], [-1, -1, 1, 0, -1])
    shallow = gather_tree(start, row=0, own_weight=1.0, max_nodes=5, max_depth=1, mode="hier")
    assert (shallow.tokens, shallow.parents) == ([2, 5, 7], [-1, -1, -1])
    assert gather_tree(start, row=0, own_weight=1.0, max_nodes=2, max_depth=3, mode="hier").tokens == [2, 5]


def test_a_single_branch_follows_the_best_child_as_deep_as_the_budget_and_depth_allow():
    """Kills mode `one` following other than the best-scored child, its parents other than a chain, or
    stopping at other than min(max_nodes, max_depth)."""
    trie = _trie([1, 2, 3, 4], [1, 2, 3, 4], [1, 5, 6, 7], [1, 2, 8])
    start = trie.find([1])
    assert gather_tree(start, 0, 1.0, max_nodes=8, max_depth=3, mode="one").tokens == [2, 3, 4]
    assert gather_tree(start, 0, 1.0, max_nodes=8, max_depth=3, mode="one").parents == [-1, 0, 1]
    assert gather_tree(start, 0, 1.0, max_nodes=2, max_depth=3, mode="one").tokens == [2, 3]
    assert gather_tree(start, 0, 1.0, max_nodes=8, max_depth=1, mode="one").tokens == [2]


def test_a_drafts_depth_and_nodes_follow_the_rows_budget_and_the_proposers_limits():
    """Kills `propose`'s node budget other than min(decoding_length, max_nodes), `_retrieve` drafting for a
    row whose budget is 0 or deeper than min(branch_length, budget), and looking up a suffix longer than
    `max_query_length` or shorter than the longest known."""
    proposer = LookaheadProposer(decoding_length=3, branch_length=3, max_query_length=2)
    prompt = [9, 1, 2, 3, 4, 8, 2, 3, 5, 6, 2, 3, 5, 6, 1]
    proposer.start([list(prompt), list(prompt), [9, 2]], None, None)
    drafts = proposer.propose(_context([3, 1, 0], 16))
    # [1] was followed by 2-3-4 once; [6, 1] is unknown, [1] alone is the longest known suffix.
    assert (drafts[0].tokens, drafts[0].parents) == ([2, 3, 4], [-1, 0, 1])
    assert drafts[1].tokens == [2]
    assert drafts[2].tokens == []
    narrow = proposer.propose(_context([3, 3, 3], 2))
    assert [len(d.tokens) for d in narrow] == [2, 2, 2]  # at most 2 nodes, whatever the budgets
    long_query = LookaheadProposer(decoding_length=1, branch_length=1, max_query_length=3)
    long_query.start([[7, 8, 9, 1, 5, 6, 9, 2, 8, 9]], None, None)  # [8, 9] -> 1 once; [9] -> 1, 2
    assert long_query.propose(_context([1], 1))[0].tokens == [1]


def test_a_rows_outputs_are_counted_from_its_first_substring_past_its_prompt():
    """Kills `new_row_state`'s first output substring other than max(0, len - depth + 1), and
    `_count_outputs` counting substrings that are not whole yet, counting any twice, or counting the
    prompt's own substrings as outputs."""
    proposer = LookaheadProposer(decoding_length=4, branch_length=1, max_query_length=1)  # depth 2
    proposer.start([[1, 2, 3], [4]], None, None)
    assert [row.counted_from for row in proposer.rows] == [2, 0]
    proposer.propose(_context([1, 1], 4))
    proposer.emitted([[7, 8], [5]], None)
    proposer.propose(_context([1, 1], 4))  # whole: 3-7, 7-8 of row 0; 4-5 of row 1; not 8 alone
    assert [row.counted_from for row in proposer.rows] == [4, 1]
    assert (proposer.trie.find([3, 7]).freq, proposer.trie.find([7, 8]).freq, proposer.trie.find([4, 5]).freq) == (
        1.0,
        1.0,
        1.0,
    )
    assert proposer.trie.find([8]) is None
    assert proposer.trie.find([1, 2]).freq == 0.0  # the prompt is not counted again as an output
    proposer.propose(_context([1, 1], 4))
    assert proposer.trie.find([3, 7]).freq == 1.0


def test_prompt_lookups_chain_is_drafted_within_the_branch_length_and_the_trie_searched_only_for_room():
    """Kills `_copied` granting prompt lookup more than min(budget, nodes, branch_length), and `propose`
    searching the trie where the chain fills the node budget (or not where it leaves room)."""
    lookup = PromptLookupProposer(1, 2)
    proposer = LookaheadProposer(decoding_length=3, branch_length=2, max_query_length=1, lookup=lookup)
    proposer.start([[5, 6, 7, 8, 5, 6, 9, 5]], None, None)
    draft = proposer.propose(_context([4], 16))[0]
    # Prompt lookup copies 6-9 (after the latest 5); the trie's 5 -> 6 -> 7 adds the branch 7.
    assert (draft.tokens, draft.parents) == ([6, 9, 7], [-1, 0, 0])
    filled = LookaheadProposer(
        decoding_length=2, branch_length=2, max_query_length=1, lookup=PromptLookupProposer(1, 2)
    )
    filled.start([[5, 6, 7, 8, 5, 6, 9, 5]], None, None)
    draft = filled.propose(_context([4], 16))[0]
    assert (draft.tokens, draft.parents) == ([6, 9], [-1, 0])


def test_a_mode_is_checked_and_says_whether_it_drafts_trees():
    """Kills the mode check accepting an unknown mode or naming the wrong ones, `drafts_trees` wrong for a
    mode, and `stats` reporting other than the trie's nodes."""
    with pytest.raises(ValueError, match="lookahead mode 'flat' is unknown; available: hier, one"):
        LookaheadProposer(4, 2, 2, mode="flat")
    assert LookaheadProposer(4, 2, 2, mode="hier").drafts_trees
    assert not LookaheadProposer(4, 2, 2, mode="one").drafts_trees
    proposer = LookaheadProposer(4, 2, 2)
    proposer.start([[1, 2, 3]], None, None)
    proposer.propose(_context([1], 4))
    assert proposer.stats() == {"trie_nodes": proposer.trie.num_nodes} and proposer.trie.num_nodes == 6


def test_pruning_stops_where_only_live_prompts_hold_the_trie_and_goes_on_while_outputs_can_decay():
    """Kills `prune`'s stop test: never stopping when a pass dropped nothing and no output count is left
    (a trie of live prompts alone over its cap would prune forever: `before` lost, `==` as `!=`, the
    output test negated, `_has_output_counts` always true), or stopping while output counts could still
    decay below 1 (`and` as `or`: a trie of outputs counted 4 times stays over its target after one
    pass)."""
    prompts = TokenTrie(depth=2, max_nodes=4)
    prompts.insert([1, 2, 3, 4], range(4), row=0)  # 7 nodes, every one a live prompt's
    assert prompts.num_nodes == 7 and prompts.find([1, 2]).prompt_total == 1
    outputs = TokenTrie(depth=1, max_nodes=10, decay=0.5)
    outputs.insert(list(range(11)) * 4, range(44))  # 11 nodes counted 4 times: 2, 1, then 0.5 drops
    assert outputs.num_nodes <= 9


def test_rows_that_join_a_running_batch_draft_from_their_own_prompt_and_prompt_lookups_record():
    """Kills `add_rows` not making the joining rows' records, or not adding them to prompt lookup's."""
    lookup = PromptLookupProposer(1, 2)
    proposer = LookaheadProposer(decoding_length=2, branch_length=2, max_query_length=1, lookup=lookup)
    proposer.start([[1, 2, 3]], None, None)
    proposer.add_rows([[7, 8, 9, 7]], None)
    assert len(lookup.rows) == 2
    assert [d.tokens for d in proposer.propose(_context([2, 2], 4))] == [[], [8, 9]]


def test_a_trie_at_its_cap_is_not_pruned_and_a_prompt_counts_each_occurrence():
    """Kills `insert` pruning a trie at exactly `max_nodes` (`>` as `>=`), and `_count` not adding up a
    row's occurrences of one substring in its prompt."""
    trie = TokenTrie(depth=1, max_nodes=3, decay=0.5)
    trie.insert([1, 2, 3], range(3))
    assert trie.num_nodes == 3
    trie.insert([1, 1], range(2), row=4)
    assert trie.find([1]).prompt == {4: 2}


def test_each_row_drafts_what_follows_in_its_own_prompt_in_either_mode():
    """Kills `_retrieve` and `propose` passing other than the row's own id to the trie's scores (a row's
    own prompt would count as another's), `gather_tree`'s mode `one` scoring without the row, and
    `_retrieve` dropping the proposer's mode (mode `one` would draft a tree)."""
    for mode in ("hier", "one"):
        proposer = LookaheadProposer(decoding_length=1, branch_length=1, max_query_length=1, mode=mode)
        proposer.start([[5, 1, 9, 5], [5, 2, 8, 5]], None, None)
        assert [d.tokens for d in proposer.propose(_context([1, 1], 1))] == [[1], [2]], mode
    one = LookaheadProposer(decoding_length=4, branch_length=2, max_query_length=1, mode="one")
    one.start([[5, 1, 3, 5, 2, 4, 5, 1, 6, 5]], None, None)
    draft = one.propose(_context([2], 4))[0]
    assert (draft.tokens, draft.parents) == ([1, 3], [-1, 0])  # a chain: 5 -> 1 (twice) -> 3 (first)


def test_finished_outputs_are_kept_up_to_max_nodes_tokens_and_counting_them_is_setup():
    """Kills the pending token count starting other than 0, or left other than 0 once `propose` counted
    them (outputs that fit `max_nodes` exactly would lose the oldest); `_finish` dropping outputs that
    fit (`>` as `>=`, `and` as `or`), dropping the only one, counting the tokens left wrong after a drop,
    or keeping a finished row's prompt counts; `propose` not counting pending outputs as setup time, or
    taking setup time other than the time since it began."""
    proposer = LookaheadProposer(decoding_length=4, branch_length=1, max_query_length=1, max_nodes=5)  # depth 2
    for counted_first in (False, True):
        proposer.start([[1, 2], [5, 6]], None, None)
        if counted_first:
            proposer.propose(_context([1, 1], 4))
        proposer.emitted([[3, 4], [7]], None)
        proposer.keep_rows([])  # outputs [2, 3, 4] and [6, 7]: 5 tokens, as many as max_nodes
        assert list(proposer.pending) == [[2, 3, 4], [6, 7]], counted_first
        assert proposer.trie.find([1, 2]) is None or proposer.trie.find([1, 2]).prompt_total == 0
        proposer.pending.clear()
        proposer._pending_tokens = 0
    proposer.start([[1], [2], [3]], None, None)
    proposer.emitted([[8, 8, 8, 8, 8, 8], [9], [7]], None)
    proposer.keep_rows([1, 2])  # 7 tokens alone: the only output is kept
    proposer.keep_rows([1])  # 7 + 2: the oldest goes
    proposer.keep_rows([])  # 2 + 2 fit
    assert list(proposer.pending) == [[2, 9], [3, 7]]
    proposer.start([[8, 9]], None, None)
    proposer.rows[0].prompt_counted = True  # only the finished outputs are left to count
    proposer.propose(_context([1], 4))
    assert 0.0 < proposer.setup_s < 60.0


def test_prompt_lookups_chain_never_exceeds_the_node_budget():
    """Kills `_copied` granting prompt lookup a chain longer than the node budget (`min(budget, nodes,
    branch_length)` without `nodes`)."""
    lookup = PromptLookupProposer(1, 2)
    proposer = LookaheadProposer(decoding_length=2, branch_length=3, max_query_length=1, lookup=lookup)
    proposer.start([[5, 6, 7, 8, 5]], None, None)
    assert proposer.propose(_context([3], 16))[0].tokens == [6, 7]


def test_a_finished_rows_prompt_is_released_whole_once():
    """Kills `release` taking back a count it already took: a substring the prompt holds twice is touched
    twice, and its count goes at the first."""
    trie = TokenTrie(depth=1, max_nodes=10)
    trie.insert([1, 1, 2], range(3), row=4)
    trie.insert([1], range(1), row=5)
    trie.release(4)
    assert (trie.find([1]).prompt, trie.find([1]).prompt_total, trie.find([2]).prompt_total) == ({5: 1}, 1, 0)


def test_the_only_finished_output_is_kept_however_long():
    """Kills `_finish` dropping the only pending output (`len(pending) > 1` as `>= 1`): a row whose output
    alone is longer than `max_nodes` still teaches the trie at the next proposal."""
    proposer = LookaheadProposer(decoding_length=4, branch_length=1, max_query_length=1, max_nodes=3)
    proposer.start([[1]], None, None)
    proposer.emitted([[8, 8, 8, 8, 8]], None)
    proposer.keep_rows([])
    assert list(proposer.pending) == [[1, 8, 8, 8, 8, 8]]

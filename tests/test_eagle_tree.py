"""EAGLE's trees (`strategies/proposers/eagle_tree.py`) on literal distributions; each test names the
mutants it kills."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.proposers.eagle_tree import (
    Calibration,
    Grown,
    _draft,
    calibrated_values,
    drafts_of,
    grow,
    offered_nodes,
    ranked_nodes,
    static_rank_prior,
    static_tree,
    verdicts,
)


def _chance(calibration: Calibration, depth: int, rank: int, confidence: float) -> float:
    """`Calibration.log_chances` of one node, as a chance."""
    [log_chance] = calibration.log_chances(
        torch.tensor([depth]), torch.tensor([rank]), torch.tensor([confidence]).log()
    )
    return math.exp(log_chance)


def test_a_verdict_falls_in_its_depth_rank_and_tenth_of_confidence():
    """Kills `Calibration`'s default bins, rank bins or prior other than 10, 3 and 4, a confidence bin
    other than min(bins - 1, int(confidence x bins)), ranks below the second kept apart, and `record`
    counting a rejection as accepted."""
    calibration = Calibration()
    for depth, rank, confidence in ((1, 0, 0.0), (1, 0, 0.09), (1, 1, 0.1), (1, 2, 0.55), (1, 5, 0.99), (1, 0, 1.0)):
        calibration.record(depth, rank, confidence, False)
    for accepted in (True, True, False, True):
        calibration.record(2, 1, 0.52, accepted)
    assert calibration.counts == {
        (1, 0, 0): [0, 2],
        (1, 1, 1): [0, 1],
        (1, 2, 5): [0, 1],
        (1, 2, 9): [0, 1],
        (1, 0, 9): [0, 1],
        (2, 1, 5): [3, 4],
    }


def test_a_chance_is_each_bins_acceptance_shrunk_toward_the_wider_bin_above_it():
    """Before any verdict a node's chance is the static tree's by rank (0.6, 0.24, 0.096 for every rank from
    the third). Four verdicts at depth 2, rank 1, confidence 0.52, three accepted, with 4 verdicts of prior
    at each level: the rank's chance (3 + 4 · 0.24) / 8 = 0.495; its 0.5-0.6 bin over every depth (3 + 4 ·
    0.495) / 8 = 0.6225; that bin at depth 2 (3 + 4 · 0.6225) / 8 = 0.68625. Kills a level left out or
    shrunk toward another, a chance read from another depth's, rank's or confidence's bin, and depths
    past the deepest verdict read as anything but empty."""
    calibration = Calibration()
    assert [_chance(calibration, 1, rank, 0.5) for rank in (0, 1, 2, 5)] == pytest.approx([0.6, 0.24, 0.096, 0.096])
    for accepted in (True, True, False, True):
        calibration.record(2, 1, 0.52, accepted)
    assert _chance(calibration, 2, 1, 0.55) == pytest.approx(0.68625)
    assert _chance(calibration, 1, 1, 0.55) == pytest.approx(0.6225)  # another depth: the bin over every depth
    assert _chance(calibration, 7, 1, 0.55) == pytest.approx(0.6225)  # deeper than any verdict, alike
    assert _chance(calibration, 2, 1, 0.65) == pytest.approx(0.495)  # another confidence: the rank's
    assert _chance(calibration, 2, 0, 0.55) == pytest.approx(0.6)  # another rank: its prior
    assert _chance(Calibration(prior=1.0), 1, 1, 0.3) == pytest.approx(0.24)


def test_the_top_guess_and_the_second_at_one_confidence_are_calibrated_apart():
    """At depth 2 the head's top-1 at 0.15 is accepted 7 times in 10, its second at 0.15 once in 20 (kept
    in one bin, both would be ranked at 8 in 30). Calibrated: the top-1's (7 + 4 · 0.6918) / 14 = 0.6977
    (its bin over every depth (7 + 4 · 0.6714) / 14, its rank (7 + 4 · 0.6) / 14), the second's (1 + 4 ·
    0.0553) / 24 = 0.0509 (its rank's (1 + 4 · 0.24) / 24 = 0.0817). Kills a calibration without ranks,
    and `grow` choosing its frontier on the head's values where it is given a score: with the
    calibration's, the top-1 below a sure token outranks a second guess of higher confidence."""
    calibration = Calibration()
    for i in range(10):
        calibration.record(2, 0, 0.15, i < 7)
    for i in range(20):
        calibration.record(2, 1, 0.15, i < 1)
    assert _chance(calibration, 2, 0, 0.15) == pytest.approx(0.69767, abs=1e-5)
    assert _chance(calibration, 2, 1, 0.15) == pytest.approx(0.05088, abs=1e-5)
    # Depth 1: tokens 1 (0.5, the top-1) and 2 (0.45). Below 1 the head's top two are 3 (0.15) and 4 (0.14);
    # below 2, 5 (0.45) and 6 (0.44). Paths by the head: 0.075, 0.07, 0.2025, 0.198: 5 and 6 go on.
    # Calibrated (no verdicts at depth 1, nor above 0.2 at depth 2: the ranks' 0.6714 and 0.0817):
    # 0.6714 · 0.6977, 0.6714 · 0.0509, 0.0817 · 0.6714, 0.0817 · 0.0817: 3 and 5.
    table = torch.full((8, 8), -30.0, dtype=torch.float64)
    table[0, 1], table[0, 2] = math.log(0.5), math.log(0.45)
    table[1, 3], table[1, 4] = math.log(0.15), math.log(0.14)
    table[2, 5], table[2, 6] = math.log(0.45), math.log(0.44)

    def expand(tokens, parents, depth):
        return table[tokens]

    raw = grow(table[[0]], 3, 2, expand)
    scored = grow(table[[0]], 3, 2, expand, calibration.score)
    assert raw.tokens[0, :6].tolist() == scored.tokens[0, :6].tolist() == [1, 2, 3, 4, 5, 6]
    assert raw.ranks[0, :6].tolist() == [0, 1, 0, 1, 0, 1]
    parents_of_depth_3 = {raw.tokens[0, p].item() for p in raw.parents[0, 6:].tolist()}
    assert parents_of_depth_3 == {5, 6}  # the frontier of depth 2: the head's best two values
    parents_of_depth_3 = {scored.tokens[0, p].item() for p in scored.parents[0, 6:].tolist()}
    assert parents_of_depth_3 == {3, 5}  # the calibrated top-1 below 1 before the second below 2


def test_a_calibrated_value_sums_the_log_chances_along_its_path_floored_at_a_tiny_chance():
    """Nodes: 0 (depth 1, the top-1 at 0.5), 1 below it (the second, 0.85), 2 (depth 1, the second at 0.25),
    3 below 1 (the top-1 at 0.4). With 1 verdict of prior: the top-1's rank (3 + 0.6) / 4 = 0.9, its 0.4
    bin (3 + 0.9) / 4 = 0.975 and that at depth 3 (3 + 0.975) / 4 = 0.99375; the second's rank 0.24 / 7,
    either bin (0 + 0.24 / 7) / 4 and at its depth a quarter of that. Kills `calibrated_values` taking a
    node's confidence against other than its parent's value (or 0 at the root), adding other than the
    parent's calibrated value (over a three-deep path), reading another node's rank, or flooring a chance
    of 0 at other than 1e-9."""
    values = [math.log(0.5), math.log(0.5 * 0.85), math.log(0.25), math.log(0.5 * 0.85 * 0.4)]
    grown = Grown(
        torch.tensor([[1, 2, 3, 4]]),
        torch.tensor([[-1, 0, -1, 1]]),
        torch.tensor([values], dtype=torch.float64),
        torch.tensor([[1, 2, 1, 3]]),
        torch.tensor([[0, 1, 1, 0]]),
    )
    calibration = Calibration(prior=1.0)
    for _ in range(3):
        calibration.record(2, 1, 0.85, False)
        calibration.record(1, 1, 0.25, False)
        calibration.record(3, 0, 0.4, True)
    [row] = calibrated_values(grown, calibration)
    second = 0.24 / 7 / 16
    expected = [math.log(0.9), math.log(0.9 * second), math.log(second), math.log(0.9 * second * 0.99375)]
    assert row == pytest.approx(expected)
    never = Calibration(prior=0.0)
    for depth, rank, confidence in ((1, 0, 0.5), (2, 1, 0.85), (1, 1, 0.25)):
        never.record(depth, rank, confidence, False)
    assert calibrated_values(grown, never)[0][0] == pytest.approx(math.log(1e-9))


def test_a_drafts_nodes_renumber_their_parents_among_the_nodes_kept():
    """Kills `_draft` indexing a kept node's parent other than by its place among the kept nodes (the
    root's -1 kept), and `ranked_nodes` keeping nodes deeper than the row's budget (`<=` as `<`)."""
    draft = _draft([10, 11, 12, 13, 14], [-1, -1, 0, 1, 3], [1, 3, 4])
    assert (draft.tokens, draft.parents) == ([11, 13, 14], [-1, 0, 1])
    grown = Grown(
        torch.tensor([[1, 2, 3]]),
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[-0.1, -0.2, -0.3]]),
        torch.tensor([[1, 2, 3]]),
        torch.tensor([[0, 0, 0]]),
    )
    assert ranked_nodes(grown, [2], 8) == [[0, 1]]
    assert ranked_nodes(grown, [0], 8) == [[]]


def test_verdicts_stop_at_the_first_emitted_token_no_child_drafted():
    """Kills `verdicts` going on below a rejected level, judging nodes whose parent was not accepted, or
    matching a child by other than its token; `offered_nodes` taking a depth-1 node's confidence against
    other than 0."""
    offered = [(-1, 5, 1, 0, 0.6), (-1, 6, 1, 1, 0.3), (0, 7, 2, 0, 0.9), (2, 8, 3, 0, 0.5)]
    assert verdicts(offered, [5, 7, 8, 1]) == [
        (1, 0, 0.6, True),
        (1, 1, 0.3, False),
        (2, 0, 0.9, True),
        (3, 0, 0.5, True),
    ]
    assert verdicts(offered, [6, 7]) == [(1, 0, 0.6, False), (1, 1, 0.3, True)]  # 6 has no children
    assert verdicts(offered, [9, 7]) == [(1, 0, 0.6, False), (1, 1, 0.3, False)]
    grown = Grown(
        torch.tensor([[5, 7]]),
        torch.tensor([[-1, 0]]),
        torch.tensor([[math.log(0.6), math.log(0.54)]]),
        torch.tensor([[1, 2]]),
        torch.tensor([[0, 2]]),
    )
    assert offered_nodes(grown, [[0, 1]]) == [[(-1, 5, 1, 0, pytest.approx(0.6)), (0, 7, 2, 2, pytest.approx(0.9))]]


def test_the_static_shapes_levels_lay_each_depth_below_its_parents_frontier():
    """Kills `_shape`'s per-level slots, frontier, ranks per parent (`top`), picks and frontier parents,
    and `static_rank_prior` other than 0.6 x 0.4^r. The shapes are cached per process: built afresh here,
    so that a shape an earlier test built cannot stand in for this one."""
    assert [static_rank_prior(r) for r in (0, 1, 2)] == pytest.approx([0.6, 0.24, 0.096])
    static_tree.cache_clear()
    tree = static_tree(nodes=7, depth=3, top_k=3)  # [0] [0,0] [1] [0,0,0] [0,1] [1,0] [2]
    first, second, third = tree.levels
    assert (first.slots.tolist(), first.frontier.tolist(), first.top) == ([0, 0, 0], [0, 1], 3)
    assert (first.picks.tolist(), first.frontier_parents.tolist()) == ([0, 1, 2], [-1, -1])
    # Depth 2: [0,0] and [0,1] below frontier node 0, [1,0] below frontier node 1; only [0,0] has children.
    assert (second.slots.tolist(), second.frontier.tolist(), second.top) == ([0, 0, 1], [0], 2)
    assert (second.picks.tolist(), second.frontier_parents.tolist()) == ([0, 1, 2], [0])
    assert (third.slots.tolist(), third.frontier.tolist(), third.top, third.picks.tolist()) == ([0], [], 1, [0])
    assert tree.order.tolist() == [0, 3, 1, 6, 4, 5, 2]
    assert tree.depths.tolist() == [1, 2, 1, 3, 2, 2, 1]
    assert tree.paths == ((0,), (0, 0), (1,), (0, 0, 0), (0, 1), (1, 0), (2,))
    assert tree.parents == (-1, 0, -1, 1, 0, 2, -1)
    assert static_tree(nodes=4, depth=2, top_k=2).paths == ((0,), (0, 0), (1,), (0, 1))


def test_a_frontier_keeps_the_best_children_of_the_whole_level_and_counts_nodes_across_levels():
    """Kills `grow` ranking a level's children other than by value (best first, stable), their parents
    other than their frontier node's index, and the node count other than the nodes grown so far."""
    vocab = 4
    table = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25] * 4, [0.1, 0.6, 0.2, 0.1]]))

    def expand(tokens, parents, level):
        return table[tokens]

    root = torch.log(torch.tensor([[0.05, 0.05, 0.5, 0.4]]))
    grown = grow(root, depth=3, top_k=2, expand=expand)
    # Depth 1: 2 (0.5), 3 (0.4). Below 2: any two at 0.125; below 3: 1 (0.24), 2 (0.08). Frontier: 3-1, then
    # 2's first child. Depth 3 below 3-1: 0 (0.168), below 2-x: x's best.
    assert grown.parents[0].tolist()[:6] == [-1, -1, 0, 0, 1, 1]
    assert grown.tokens[0, 4:6].tolist() == [1, 2]
    assert grown.parents[0].tolist()[6:] == [4, 4, 2, 2]
    assert grown.values[0, 6].exp().item() == pytest.approx(0.4 * 0.6 * 0.7)
    assert vocab == table.shape[1]


def test_a_tree_grown_for_the_nodes_kept_expands_fewer_nodes_and_keeps_the_same():
    """Kills `grow`'s `keep` leaving out a frontier node that has a kept descendant (the drafts differ), and
    not leaving out those that cannot (as many nodes fed as without it). A peaked table: one sure child per
    token, so most of each frontier falls below the kept nodes' floor."""
    torch.manual_seed(0)
    table = torch.log_softmax(torch.randn(32, 32, dtype=torch.float64) * 4, dim=-1)  # next token's by token
    fed = []

    def expand(tokens, parents, depth):
        fed.append(tokens.shape[1])
        return table[tokens]

    root = table[torch.tensor([1, 7, 12])]
    for keep in (1, 3, 5, 8, 20):
        fed.clear()
        whole = grow(root, 5, 4, expand)
        fed_whole = sum(fed)
        fed.clear()
        pruned = grow(root, 5, 4, expand, keep=keep)
        kept = ranked_nodes(whole, [5, 5, 3], keep)
        kept_pruned = ranked_nodes(pruned, [5, 5, 3], keep)
        drafts = [(d.tokens, d.parents) for d in drafts_of(whole, kept)]
        assert drafts == [(d.tokens, d.parents) for d in drafts_of(pruned, kept_pruned)], keep
        assert sum(fed) < fed_whole or keep == 20, (keep, fed)

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
    grow,
    offered_nodes,
    ranked_nodes,
    static_rank_prior,
    static_tree,
    verdicts,
)


def test_a_confidence_falls_in_its_tenth_and_a_sure_one_in_the_last():
    """Kills `Calibration`'s default bins or prior other than 10 and 4, `_bin` other than
    min(bins - 1, int(confidence x bins)), `record` counting a rejection as accepted, and `chance`
    other than (accepted + prior x confidence) / (offered + prior)."""
    calibration = Calibration()
    assert [calibration._bin(c) for c in (0.0, 0.09, 0.1, 0.55, 0.99, 1.0)] == [0, 0, 1, 5, 9, 9]
    assert calibration.chance(1, 0.5) == 0.5  # no verdicts: the confidence itself
    for accepted in (True, True, False, True):
        calibration.record(2, 0.52, accepted)
    assert calibration.counts == {(2, 5): [3, 4]}
    assert calibration.chance(2, 0.55) == pytest.approx((3 + 4 * 0.55) / 8)
    assert calibration.chance(1, 0.55) == pytest.approx(0.55)  # another depth's bin
    assert Calibration(bins=4, prior=1.0).chance(1, 0.3) == pytest.approx(0.3)


def test_a_calibrated_value_sums_the_log_chances_along_its_path_floored_at_a_tiny_chance():
    """Kills `calibrated_values` taking a node's confidence against other than its parent's value (or 0
    at the root), adding other than the parent's calibrated value, or flooring a chance of 0 at other
    than 1e-9."""
    values = [math.log(0.5), math.log(0.5 * 0.85), math.log(0.25)]
    grown = Grown(
        torch.tensor([[1, 2, 3]]),
        torch.tensor([[-1, 0, -1]]),
        torch.tensor([values], dtype=torch.float64),
        torch.tensor([[1, 2, 1]]),
    )
    calibration = Calibration(prior=1.0)
    for _ in range(3):
        calibration.record(2, 0.85, False)  # depth 2, bin 8: (0 + 0.85) / 4
        calibration.record(1, 0.25, False)  # depth 1, bin 2: (0 + 0.25) / 4
    [row] = calibrated_values(grown, calibration)
    assert row == pytest.approx([math.log(0.5), math.log(0.5) + math.log(0.2125), math.log(0.0625)])
    never = Calibration(prior=0.0)
    for depth, confidence in ((1, 0.5), (2, 0.85), (1, 0.25)):
        never.record(depth, confidence, False)
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
    )
    assert ranked_nodes(grown, [2], 8) == [[0, 1]]
    assert ranked_nodes(grown, [0], 8) == [[]]


def test_verdicts_stop_at_the_first_emitted_token_no_child_drafted():
    """Kills `verdicts` going on below a rejected level, judging nodes whose parent was not accepted, or
    matching a child by other than its token; `offered_nodes` taking a depth-1 node's confidence against
    other than 0."""
    offered = [(-1, 5, 1, 0.6), (-1, 6, 1, 0.3), (0, 7, 2, 0.9), (2, 8, 3, 0.5)]
    assert verdicts(offered, [5, 7, 8, 1]) == [(1, 0.6, True), (1, 0.3, False), (2, 0.9, True), (3, 0.5, True)]
    assert verdicts(offered, [6, 7]) == [(1, 0.6, False), (1, 0.3, True)]  # 6 has no children
    assert verdicts(offered, [9, 7]) == [(1, 0.6, False), (1, 0.3, False)]
    grown = Grown(
        torch.tensor([[5, 7]]),
        torch.tensor([[-1, 0]]),
        torch.tensor([[math.log(0.6), math.log(0.54)]]),
        torch.tensor([[1, 2]]),
    )
    assert offered_nodes(grown, [[0, 1]]) == [[(-1, 5, 1, pytest.approx(0.6)), (0, 7, 2, pytest.approx(0.9))]]


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

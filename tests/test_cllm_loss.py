"""CLLM's losses pinned by a hand computation on a scripted target whose distributions are literal.

Checked by hand: with the consistency mask reduced to the positions where the state differs
(`diverged = state != fixed`, without the cumulative sum), or widened to every position, the
first test fails; so does it with L_AR's label smoothing dropped, and the second with the
fixed point's distributions no longer detached.
"""

from __future__ import annotations

import math

import torch
from bigram_model import bigram_model

from jobs.train.cllm_loss import cllm_losses
from jobs.train.cllm_trajectories import Trajectories

# The target's next-token distribution after each token of a 4-token vocabulary.
AFTER = torch.tensor(
    [
        [1 / 2, 1 / 4, 1 / 8, 1 / 8],  # after 0
        [1 / 4, 1 / 4, 1 / 4, 1 / 4],  # after 1
        [1 / 4, 1 / 4, 1 / 4, 1 / 4],  # after 2
        [1 / 8, 1 / 8, 1 / 4, 1 / 2],  # after 3
    ],
    dtype=torch.float64,
)
LN2 = math.log(2)


def _model_and_block() -> tuple[torch.nn.Module, Trajectories]:
    """The scripted target (float32, as training runs) and one block: context [3], state y = [0 3 2],
    fixed point y* = [0 1 2]."""
    data = Trajectories(
        sequences=torch.tensor([[3, 0, 1, 2]]),  # the prompt, then the block's fixed point
        states=torch.tensor([[0, 3, 2], [0, 1, 2]]),  # the block's states: y, then the fixed point
        blocks=torch.tensor([[0, 0, 0, 2]]),  # (row, block k, first state, count)
        prompt_tokens=1,
        corpus=torch.tensor([[3, 0, 3, 3]]),  # the corpus window: the prompt, then the corpus' own text
    )
    return bigram_model(AFTER.log()).float(), data


def test_consistency_and_autoregressive_losses_by_hand():
    """Context [3], fixed point y* = [0 1 2], state y = [0 3 2]: y is wrong at position 1 only, and
    position 2, right but after a wrong token, still counts (the loss runs from the first wrong one).

    Position i's distribution comes from the token before it: on y, after 3, 0, 3; on y*, after 3, 0, 1.
    L_GC = mean over positions 1, 2 of the cross-entropy of p(.|y*) against p(.|y):
      position 1: H(after 0) = 1/2·1 + 1/4·2 + 2·1/8·3 = 1.75 bits;
      position 2: CE(after 1, after 3) = 1/4·(3 + 3 + 2 + 1) = 2.25 bits; mean 2 bits.
    L_AR = mean over the 3 positions of (1 − s)·(−log p(y*_i)) + s·mean_u(−log p(u)), s = 0.1, on y*:
      position 0 (after 3, label 0): 0.9·3 + 0.1·2.25; position 1 (after 0, label 1): 0.9·2 + 0.1·2.25;
      position 2 (after 1, label 2): 0.9·2 + 0.1·2 bits.
    """
    model, data = _model_and_block()
    consistency, autoregressive = cllm_losses(model, data, torch.tensor([[0, 0]]), label_smoothing=0.1)
    assert math.isclose(consistency.item(), 2 * LN2, rel_tol=1e-6)
    expected_ar = ((0.9 * 3 + 0.225) + (0.9 * 2 + 0.225) + (0.9 * 2 + 0.2)) / 3 * LN2
    assert math.isclose(autoregressive.item(), expected_ar, rel_tol=1e-6)


def test_corpus_labels_train_the_autoregressive_loss_on_the_corpus_text():
    """`loss.ar_labels=corpus` (the paper's use_gt_labels): L_AR reads the corpus window [3 0 3 3] on its
    own context, labels 0 after 3, 3 after 0, 3 after 3, s = 0.1:
      (0.9·3 + 0.1·2.25) + (0.9·3 + 0.1·2.25) + (0.9·1 + 0.1·2.25) bits over 3 positions.
    L_GC does not change: it reads the trajectory alone."""
    model, data = _model_and_block()
    consistency, autoregressive = cllm_losses(model, data, torch.tensor([[0, 0]]), 0.1, ar_labels="corpus")
    assert math.isclose(consistency.item(), 2 * LN2, rel_tol=1e-6)
    expected_ar = ((0.9 * 3 + 0.225) + (0.9 * 3 + 0.225) + (0.9 * 1 + 0.225)) / 3 * LN2
    assert math.isclose(autoregressive.item(), expected_ar, rel_tol=1e-6)


def test_the_consistency_loss_teaches_the_state_toward_the_fixed_point_only():
    """The fixed point's distributions are the target (detached): the gradient of L_GC reaches only the
    LM head's columns read on the state side. Here y and y* differ only in the token before position
    2 (3 on y, 1 on y*), and position 1 reads 0 on both, which L_GC leaves at its optimum."""
    model, data = _model_and_block()
    consistency, _ = cllm_losses(model, data, torch.tensor([[0, 0]]), label_smoothing=0.1)
    (grad,) = torch.autograd.grad(consistency, model.lm_head.weight)  # [V, H]: column t reads token t
    column_norms = grad.norm(dim=0).tolist()
    assert column_norms[3] > 1e-3  # the state's side: after 3, pulled toward "after 1"
    assert column_norms[0] < 1e-6  # same input on both sides: soft-CE at its minimum, no gradient
    assert column_norms[1] == 0.0  # read only on the fixed point's side: detached

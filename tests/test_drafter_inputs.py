"""Drafters read what they were trained on: each EAGLE tree node's predicted feature is the head's
causal pass over the node's root-to-node path (its inputs and positions as training feeds them), and
Medusa / blockwise heads read the target's final-norm state at the last accepted position, the one
that chose the pending token. Exact verification keeps the output greedy whatever a drafter reads:
these are what notice a drafter guessing from the wrong inputs."""

from __future__ import annotations

import pytest
import torch
from drafted import assert_drafted
from mixed_prompts import PROMPTS
from test_eagle import tiny_eagle
from test_medusa import tiny_heads
from transformers import AutoModelForCausalLM

from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.methods.medusa import MEDUSA_TREE
from strategies.proposers import eagle as eagle_module
from strategies.proposers.eagle import EagleProposer
from strategies.proposers.medusa import HeadsProposer
from strategies.proposers.medusa_choices import chain_choices
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from strategies.verification.drafting import DraftingMethod
from strategies.verification.speculative import SpeculativeStrategy

DEPTH = 4


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))


def _params(n):
    return GenerationParams(n, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)


def _requests(prompts):
    return [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]


def _final_states(target: ModelRunner, tokens: list[int]) -> torch.Tensor:
    """[T, H] the target's last hidden states (after its final norm) over `tokens`, from a plain forward."""
    with torch.inference_mode():
        return target.model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]


class TracingEagle(EagleProposer):
    """Keeps, for every proposal: each row's context, the root the head predicted, and per expansion of
    the tree the target ids of the nodes fed, their parents in the previous expansion, and the
    features the head predicted for them."""

    def __init__(self, head, top_k, static_nodes=0):
        super().__init__(head, top_k, static_nodes)
        self.traces: list[dict] = []

    def propose(self, context):
        self.trace = {"contexts": [list(row.context) for row in self.rows], "levels": []}
        self.traces.append(self.trace)
        return super().propose(context)

    def _feed_target_features(self):
        root = super()._feed_target_features()
        self.trace["root"] = root.clone()
        return root

    def traced(self, expand):
        """`expand` as the tree growers call it, recording what each call fed and predicted."""
        forward = self.head.forward

        def recorded(tokens, parents, level):
            out = []
            self.head.forward = lambda *args: out.append(forward(*args)) or out[-1]
            try:
                log_probs = expand(tokens, parents, level)
            finally:
                del self.head.forward
            self.trace["levels"].append((self.head.to_target(tokens).clone(), parents.clone(), out[0].clone()))
            return log_probs

        return recorded


def _tracing(grower, proposer: TracingEagle):
    """`grower` (`grow`, `grow_static`) with its `expand`, the last positional argument, traced."""

    def traced(*args, **score):
        return grower(*args[:-1], proposer.traced(args[-1]), **score)

    return traced


def _node_paths(levels, row):
    """Per expansion, the token path from the root to each node fed (parents index the previous one)."""
    paths, previous = [], None
    for tokens, parents, _ in levels:
        tokens, parents = tokens[row].tolist(), parents[row].tolist()
        current = [(t,) if previous is None else previous[p] + (t,) for t, p in zip(tokens, parents, strict=True)]
        paths.append(current)
        previous = current
    return paths


@pytest.mark.parametrize(("top_k", "static_nodes"), [(1, 0), (3, 0), (3, 12)], ids=["chain", "dynamic", "static"])
def test_every_eagle_node_predicts_the_feature_of_a_causal_pass_over_its_path(
    target, tiny_model_dir, monkeypatch, top_k, static_nodes
):
    """Training feeds the head (the target's feature f_t, token t+1) at position t, one causal chain.
    Below the pending token (the context's last, at position L-1), a node at depth d with path
    x_1 … x_d is that chain continued: f_0 … f_{L-2} with tokens 1 … L-1, then (the root's predicted
    feature, x_1) at L-1, then (the predicted feature of x_1 … x_{i-1}, x_i) at L-2+i. Checked over
    several decode steps of a batch of mixed lengths, so the head's cache after each step counts too.

    Catches the planted bugs "EAGLE head fed (feature t, token t)" (the root differs), "EAGLE head cache
    never truncated" (the proposer raises at its second step: a fault), "EAGLE tree growth feeds the
    root's feature at every depth" and "EAGLE rotary position of every depth set to the pending
    token's" (the nodes below depth 1 differ)."""
    head = tiny_eagle(target, tiny_model_dir)
    proposer = TracingEagle(head, top_k, static_nodes)
    for name in ("grow", "grow_static"):
        monkeypatch.setattr(eagle_module, name, _tracing(getattr(eagle_module, name), proposer))
    trees = top_k > 1
    drafting = DraftingMethod("eagle", proposer, DEPTH, 12 if trees else DEPTH, trees=trees)
    params = _params(12)
    out = SpeculativeStrategy("eagle", target, [drafting]).generate(_requests(PROMPTS), params)
    assert [r.tokens for r in out.rows] == [
        r.tokens for r in AutoregressiveStrategy(target).generate(_requests(PROMPTS), params).rows
    ]
    assert_drafted(out.stats, every_step=True)
    assert len(proposer.traces) >= 3

    with torch.inference_mode():
        checked = sum(_check_trace(target, head, trace) for trace in proposer.traces[:3])
    assert checked >= 3 * len(PROMPTS) * (DEPTH - 1)  # every row's nodes at depths 1 … DEPTH-1 were fed


def _check_trace(target: ModelRunner, head, trace: dict) -> int:
    """Compare one proposal's root and fed nodes with causal passes of the head; the number of nodes."""
    checked = 0
    for row, context in enumerate(trace["contexts"]):
        features = list(_final_states(target, context[:-1]))  # f_0 … f_{L-2}
        tokens = context[1:]  # each f_t's next token, the pending token last

        def causal(more_features, more_tokens, features=features, tokens=tokens):
            f = torch.stack(features + more_features)[None]
            t = torch.tensor([tokens + more_tokens])
            return head(f, t, torch.arange(t.shape[1])[None])[0, -1]

        predicted = {(): causal([], [])}
        assert torch.allclose(trace["root"][row], predicted[()], atol=1e-9), "the root"
        for paths, (_, _, fed) in zip(_node_paths(trace["levels"], row), trace["levels"], strict=True):
            for n, path in enumerate(paths):
                if path not in predicted:
                    predicted[path] = causal([predicted[path[:i]] for i in range(len(path))], list(path))
                assert torch.allclose(fed[row, n], predicted[path], atol=1e-9), path
                checked += 1
    return checked


class TracingHeads(HeadsProposer):
    """Keeps each row's context as it grows, and, for every proposal, the contexts and the states
    the heads read."""

    def __init__(self, name, heads, choices):
        super().__init__(name, heads, choices)
        self.seen: list[tuple[list[list[int]], torch.Tensor]] = []

    def start(self, contexts, params, states):
        super().start(contexts, params, states)
        self.contexts = [list(c) for c in contexts]

    def emitted(self, emitted, states):
        super().emitted(emitted, states)
        for context, tokens in zip(self.contexts, emitted, strict=True):
            context.extend(tokens)

    def keep_rows(self, rows):
        super().keep_rows(rows)
        self.contexts = [self.contexts[r] for r in rows]

    def propose(self, context):
        read = self.heads.draft_logits
        self.heads.draft_logits = lambda hidden, *rest: (
            self.seen.append(([list(c) for c in self.contexts], hidden.clone())) or read(hidden, *rest)
        )
        try:
            return super().propose(context)
        finally:
            del self.heads.draft_logits


@pytest.mark.parametrize("choices", [MEDUSA_TREE, chain_choices(DEPTH)], ids=["medusa", "blockwise"])
def test_heads_read_the_final_state_of_the_last_accepted_position(target, tiny_model_dir, choices):
    """Head i is trained on h_t, the target's final-norm state at position t, to guess token t+2+i
    (t+1 is the target's own): drafting below a pending token at position L-1, the heads must read
    h_{L-2}, from the step that just verified, at every step of every row.

    Catches the planted bugs "Medusa heads read the previous step's hidden state" and "Medusa's
    proposer raises from its third draft on" (a fault)."""
    heads = tiny_heads(target, tiny_model_dir)
    proposer = TracingHeads("heads", heads, [list(c) for c in choices])
    depth = max(len(c) for c in choices)
    drafting = DraftingMethod("heads", proposer, depth, len(choices), trees=True)
    out = SpeculativeStrategy("heads", target, [drafting]).generate(_requests(PROMPTS), _params(16))
    assert_drafted(out.stats, every_step=True)
    assert len(proposer.seen) >= 3
    for contexts, hidden in proposer.seen:
        for row, context in enumerate(contexts):
            expected = _final_states(target, context[:-1])[-1]
            assert torch.allclose(hidden[row], expected, atol=1e-9), (row, len(context))

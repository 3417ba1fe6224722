"""The lean Llama-family forward computes what transformers computes (float64, chains and trees)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from strategies.base import GenerationParams, RowRequest
from strategies.decoders.autoregressive import AutoregressiveStrategy
from strategies.runtime import llama_forward
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _models():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    qwen = Qwen2ForCausalLM(Qwen2Config(**SMALL, use_sliding_window=False))  # q/k/v biases
    return [m.double().eval() for m in (llama, qwen)]


def _both_runners(model):
    fast = ModelRunner(model)
    reference = ModelRunner(model)
    reference._fast = None
    assert fast._fast is not None
    return fast, reference


@pytest.mark.parametrize("model", _models(), ids=["llama", "qwen2"])
def test_prefill_and_tree_step_match_transformers(model):
    fast, reference = _both_runners(model)
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    # A tree of 4 nodes per row: 0 -> 1, 0 -> 2 -> 3 (each node sees only its ancestors).
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    nodes = torch.tensor([[10, 11, 12, 13], [14, 15, 16, 17]])
    results = []
    for runner in (fast, reference):
        kv = runner.new_kv(2)
        first = runner.prefill(kv, prompts).logits
        depth = torch.tensor([0, 1, 1, 2])
        out = runner.forward(
            kv, nodes, kv.next_pos[:, None] + depth, torch.ones_like(nodes, dtype=torch.bool), tree.expand(2, 4, 4)
        )
        results.append((first, out.logits))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-10)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-10)


def _gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64)).double().eval()


@pytest.mark.parametrize("model", [*_models(), _gpt2()], ids=["llama", "qwen2", "gpt2"])
def test_a_prefill_in_chunks_leaves_what_one_forward_over_the_prompts_leaves(model, monkeypatch):
    """Logits, hidden states and the cache after a prefill of mixed lengths in chunks of 2 columns (one
    row's prompt is all padding in the first chunks), then a step over that cache: as one forward's.
    A padding slot's hidden state is nobody's: compared at valid slots only."""
    from strategies.runtime import runner as runner_module

    prompts = [list(range(3, 13)), [8, 9], list(range(20, 27))]
    results = []
    for chunk_tokens in (10**9, 6):  # one chunk; then 6 tokens over 3 rows: 2 columns a chunk
        monkeypatch.setattr(runner_module, "PREFILL_CHUNK_TOKENS", chunk_tokens)
        monkeypatch.setattr(runner_module, "PREFILL_MIN_CHUNK", 2)
        runner = ModelRunner(model)
        kv = runner.new_kv(len(prompts))
        calls, forward = [], runner.forward

        def counted(*args, calls=calls, forward=forward, **kwargs):
            calls.append(args[1].shape[1])  # the columns of this forward
            return forward(*args, **kwargs)

        monkeypatch.setattr(runner, "forward", counted)
        first = runner.prefill(kv, prompts, want_hidden=True)
        hidden = first.hidden.masked_fill(~kv.valid[..., None], 0)  # [B, L, H]
        nodes = torch.tensor([[30], [31], [32]])
        step = forward(kv, nodes, kv.next_pos[:, None], torch.ones_like(nodes, dtype=torch.bool))
        results.append((calls, first.logits, hidden, kv.valid.clone(), kv.next_pos.clone(), step.logits))
    (whole_calls, *whole), (chunk_calls, *chunked) = results
    assert whole_calls == [10] and chunk_calls == [2, 2, 2, 2, 2]
    for a, b in zip(whole, chunked, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a.double(), b.double(), atol=1e-10)


def test_slots_computed_are_the_valid_ones_rounded_up_to_a_warmed_row_count():
    """Up to `exact_up_to` valid slots run as they are; more are rounded up to a multiple of the rows
    (a padded forward's row count), with the first padding slots; a grid nearly full runs whole."""
    valid = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)  # 7 of 15
    exact = llama_forward.Slots.of(valid, exact_up_to=8)
    assert exact.grid == (3, 5) and exact.index.tolist() == [0, 1, 5, 10, 11, 12, 13]
    rounded = llama_forward.Slots.of(valid, exact_up_to=4)  # 7 -> 9, the padding slots 2 and 3 computed
    assert rounded.index.tolist() == [0, 1, 2, 3, 5, 10, 11, 12, 13]
    x = torch.arange(15.0).view(3, 5, 1)
    assert rounded.take(x).flatten().tolist() == [0, 1, 2, 3, 5, 10, 11, 12, 13]
    assert rounded.spread(rounded.take(x)).flatten().tolist() == [0, 1, 2, 3, 0, 5, 0, 0, 0, 0, 10, 11, 12, 13, 0]
    nearly_full = torch.ones(3, 5, dtype=torch.bool)
    nearly_full[0, 4] = False  # 14 of 15: above `PACK_BELOW_FILL`
    assert llama_forward.Slots.of(nearly_full, exact_up_to=20) is None
    assert llama_forward.Slots.of(valid.to("meta"), exact_up_to=8) is None  # off the CPU: padded


@pytest.mark.parametrize("model", _models(), ids=["llama", "qwen2"])
def test_a_ragged_forward_over_its_valid_slots_alone_gives_what_the_padded_one_gives(model, monkeypatch):
    """A chain of ragged drafts (rows of 1, 3 and 5 valid slots, 5 wide) and a tree over them, in
    float64: logits and hidden states at the valid slots, and the step after, as the padded forward's."""
    runner = ModelRunner(model)
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    new_valid = torch.arange(5)[None, :] < torch.tensor([[1], [3], [5]])  # [3, 5]: 9 of 15 valid
    ids = torch.tensor([[20, 0, 0, 0, 0], [21, 22, 23, 0, 0], [24, 25, 26, 27, 28]])
    tree = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 1]], dtype=torch.bool
    )
    packed_layers, real = [], llama_forward.LlamaForward._packed_layer
    monkeypatch.setattr(
        llama_forward.LlamaForward, "_packed_layer", lambda *a, **k: packed_layers.append(1) or real(*a, **k)
    )
    results = []
    for fill in (-1.0, llama_forward.PACK_BELOW_FILL):  # padded, then over the valid slots
        monkeypatch.setattr(llama_forward, "PACK_BELOW_FILL", fill)
        packed_layers.clear()
        outs = []
        for attend in (None, tree.expand(3, 5, 5)):
            kv = runner.new_kv(3)
            runner.prefill(kv, prompts)
            depth = torch.arange(5) if attend is None else torch.tensor([0, 1, 1, 2, 2])
            out = runner.forward(kv, ids, kv.next_pos[:, None] + depth, new_valid, attend, want_hidden=True)
            assert out.computed == (9 if fill > 0 else None)  # what the controller prices the forward by
            after = torch.tensor([[30], [31], [32]])
            step = runner.forward(kv, after, kv.next_pos[:, None], torch.ones_like(after, dtype=torch.bool))
            outs += [out.logits[new_valid], out.hidden[new_valid], step.logits]
        results.append(outs)
        assert bool(packed_layers) == (fill > 0)
    for padded, packed in zip(*results, strict=True):
        assert torch.allclose(padded, packed, atol=1e-10)


def test_unsupported_architectures_take_the_transformers_path():
    gpt2 = _gpt2()
    assert not llama_forward.supports(gpt2)
    runner = ModelRunner(gpt2)
    assert runner._fast is None
    params = GenerationParams(8, SamplingParams(), frozenset(), ignore_eos=True)
    rows = AutoregressiveStrategy(runner).generate([RowRequest([3, 4, 5], 1), RowRequest([6], 2)], params).rows
    for prompt, row in zip(([3, 4, 5], [6]), rows, strict=True):
        expected = gpt2.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert row.tokens == expected[0, len(prompt) :].tolist()


@pytest.mark.slow  # compiling takes a minute or more on 2 cores
def test_compiled_layers_decode_the_same_greedy_tokens_as_eager():
    """`model.compile`: chains of one token (plain steps) and of several (speculative verify), batch 1
    and a batch of mixed lengths, in float64: the compiled parts compute what the eager ones do."""
    from mixed_prompts import PROMPTS
    from scripted_proposer import ScriptedProposer

    from strategies.verification.drafting import DraftingMethod
    from strategies.verification.speculative import SpeculativeStrategy

    model = _models()[0]
    eager, compiled = ModelRunner(model), ModelRunner(model)
    compiled.compile()
    params = GenerationParams(12, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True)
    for prompts in (PROMPTS[:1], PROMPTS):
        requests = [RowRequest(prompt=list(p), key=i) for i, p in enumerate(prompts)]
        expected = [r.tokens for r in AutoregressiveStrategy(eager).generate(requests, params).rows]
        assert [r.tokens for r in AutoregressiveStrategy(compiled).generate(requests, params).rows] == expected
        for right in (True, False):  # verify chains all accepted, or all rejected
            drafter = DraftingMethod("speculative", ScriptedProposer(expected, compiled.vocab_size, right), 4, 4)
            speculative = SpeculativeStrategy("speculative", compiled, [drafter])
            assert [r.tokens for r in speculative.generate(requests, params).rows] == expected


def test_compile_names_the_key_for_a_model_without_the_lean_forward():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    with pytest.raises(ValueError, match=r"this target is 'gpt2': set model.compile=false"):
        ModelRunner(model).compile()

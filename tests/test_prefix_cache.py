"""The prefix cache: its blocks on literal tensors (hash chain, longest prefix, the last-token rule, LRU at
the byte bound, collisions), and prefills through it, which must give every strategy the tokens (and
log-probabilities) of prefills without it, float64, batch 1 and 8, mixed lengths and shared prefixes."""

from __future__ import annotations

import pytest
import torch
from test_continuous import _joined
from test_eagle import tiny_eagle
from transformers import AutoModelForCausalLM, AutoTokenizer

from jobs.bench.prefix import shared_prefix_prompts
from strategies import registry
from strategies.base import GenerationParams, RowRequest
from strategies.options import StrategyOptions
from strategies.runtime import prefix_cache
from strategies.runtime.cached_prefill import prefill, shared_uncached
from strategies.runtime.prefix_cache import BLOCK_TOKENS, PrefixCache
from strategies.runtime.runner import ModelRunner
from strategies.runtime.sampling import SamplingParams
from workers.unit_rows import batch_order

BLOCK = 4
SHARED = list(range(5, 18))  # 13 tokens: three full blocks and one token
PROMPTS = [  # mixed lengths; rows 0, 1, 2, 6 share three blocks, row 3 two, rows 4, 5, 7 none
    [*SHARED, 30, 31],
    [*SHARED, 32],
    [*SHARED, 30, 31, 33, 34, 35, 36, 37],
    [*SHARED[:9], 40, 41, 42, 43, 44, 45],
    [50, 51, 52, 53, 54, 55, 56, 57],
    [60],
    SHARED,
    [70, 71, 72],
]
NEW_TOKENS = 12


def _kv(first: int, blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [layers=2, H=1, block, D=2] of `blocks` blocks, marked by `first`."""
    keys = torch.full((2, 1, BLOCK * blocks, 2), float(first))
    return keys, keys + 0.5


def _filled(cache: PrefixCache, prompt: list[int]) -> list:
    """Add every full block of `prompt`, each marked by its index."""
    chain, parent = [], None
    for i in range(len(prompt) // BLOCK):
        parent = cache.add(parent, tuple(prompt[i * BLOCK : (i + 1) * BLOCK]), *_kv(i))
        chain.append(parent)
    return chain


def test_a_lookup_walks_the_hash_chain_to_the_longest_cached_prefix():
    cache = PrefixCache(1 << 20, BLOCK)
    chain = _filled(cache, list(range(12)))
    assert cache.lookup(list(range(20)), 20) == chain
    assert cache.lookup([*range(8), 99, 9, 10, 11], 12) == chain[:2]  # a block differs: the chain stops there
    assert cache.lookup([1, *range(1, 12)], 12) == []
    assert cache.lookup(list(range(4, 12)), 8) == []  # the same tokens at another place are another chain


def test_the_last_prompt_token_is_never_read_from_the_cache():
    cache = PrefixCache(1 << 20, BLOCK)
    _filled(cache, list(range(12)))
    prompt = list(range(12))
    assert len(cache.lookup(prompt, len(prompt) - 1)) == 2  # the third block holds the last token: computed
    assert shared_uncached(cache, [list(range(9)), list(range(9))], False) == []  # both cached up to their last


def test_least_recently_used_blocks_go_first_at_the_byte_bound():
    one = sum(t.nbytes for t in _kv(0))
    cache = PrefixCache(3 * one, BLOCK)
    a = _filled(cache, list(range(8)))  # two blocks
    cache.lookup(list(range(8)), 8)  # used again: the root most recent, its leaf next
    b = _filled(cache, list(range(100, 108)))
    assert cache.nbytes <= 3 * one and len(cache) == 3
    assert cache.lookup(list(range(8)), 8) == a[:1]  # a's leaf, the least recent, went first
    assert cache.lookup(list(range(100, 108)), 8) == b
    assert cache.add(None, (1, 2, 3, 4), *_kv(0, blocks=4)) is None  # larger than the whole bound: not kept
    assert prefix_cache.PrefixCache(0, BLOCK).add(None, (1, 2, 3, 4), *_kv(0)) is None


def test_a_colliding_key_is_a_miss_never_another_prefixs_block(monkeypatch):
    monkeypatch.setattr(prefix_cache, "block_key", lambda parent, tokens: 7)  # every block under one key
    cache = PrefixCache(1 << 20, BLOCK)
    _filled(cache, [1, 2, 3, 4])
    assert cache.lookup([9, 9, 9, 9, 5], 5) == []  # the key is there; the tokens are not these
    _filled(cache, [9, 9, 9, 9, 1, 2, 3, 4])  # its second block takes the one key
    assert cache.lookup([1, 2, 3, 4, 5], 5) == []  # these tokens, after another block: not this prompt's
    assert cache.lookup([9, 9, 9, 9, 1], 5) == []


def test_the_counts_drain():
    cache = PrefixCache(1 << 20, BLOCK)
    _filled(cache, list(range(8)))
    assert cache.drain_counts()["inserted_blocks"] == 2
    assert cache.drain_counts()["inserted_blocks"] == 0


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_draft_dir) -> registry.Models:
    target = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64))
    draft = ModelRunner(AutoModelForCausalLM.from_pretrained(tiny_draft_dir, dtype=torch.float64))
    return registry.Models(target, draft=draft, eagle=tiny_eagle(target, tiny_model_dir))


def _generate(models: registry.Models, name: str, prompts: list[list[int]], cached: bool):
    """Each row's (tokens, log-probabilities) decoding `prompts` one batch after another (a list of
    batches), through fresh prefix caches or none."""
    for runner in (models.target, models.get("draft")):
        runner.prefix_cache = PrefixCache(1 << 24, BLOCK) if cached else None
    options = StrategyOptions(name=name, adaptive=False)
    strategy = registry.create(options, models, None)
    params = GenerationParams(NEW_TOKENS, SamplingParams(), eos_token_ids=frozenset(), ignore_eos=True, logprobs=2)
    rows = []
    for batch in prompts:
        requests = [RowRequest(prompt=list(p), key=i) for i, p in enumerate(batch)]
        rows += strategy.generate(requests, params).rows
    return [(r.tokens, [s.logprob for s in r.logprobs]) for r in rows]


@pytest.mark.parametrize("name", ["autoregressive", "speculative", "prompt_lookup", "eagle"])
@pytest.mark.parametrize("batching", ["batch1", "batch8"])
def test_prefills_through_the_cache_decode_as_prefills_without_it(models, name, batching):
    """Twice through one cache: the first pass shares prefixes within its batch (or, at batch 1, reads
    what the rows before it added), the second reads whole prefixes added by the first."""
    batches = [[p] for p in PROMPTS] if batching == "batch1" else [PROMPTS]
    reference = _generate(models, name, batches, cached=False)
    found = _generate(models, name, batches + batches, cached=True)
    assert models.target.prefix_cache.drain_counts()["cached_tokens"] > 0
    if name == "speculative":  # the draft model's own cache
        assert models.get("draft").prefix_cache.drain_counts()["cached_tokens"] > 0
    for rows in (found[: len(PROMPTS)], found[len(PROMPTS) :]):
        assert [tokens for tokens, _ in rows] == [tokens for tokens, _ in reference]
        for (_, logprobs), (_, expected) in zip(rows, reference, strict=True):
            assert logprobs == pytest.approx(expected, abs=1e-9)


def test_shared_prefixes_are_computed_once_and_a_second_batch_reuses_them(models):
    runner = models.target
    runner.prefix_cache = cache = PrefixCache(1 << 24, BLOCK)
    out = prefill(runner, runner.new_kv(len(PROMPTS)), PROMPTS)
    first = cache.drain_counts()
    # The three blocks that rows share once (row 3's two among them), then each row's uncached rest.
    cached = [12, 12, 12, 8, 0, 0, 12, 0]
    assert first["forwarded_tokens"] == 12 + sum(len(p) - c for p, c in zip(PROMPTS, cached, strict=True))
    runner.prefix_cache = None
    plain = runner.prefill(runner.new_kv(len(PROMPTS)), PROMPTS)
    assert torch.allclose(out.logits, plain.logits, atol=1e-12)
    runner.prefix_cache = cache
    prefill(runner, runner.new_kv(len(PROMPTS)), PROMPTS)
    second = cache.drain_counts()
    # Every full block of the first batch was added: a row finds all of its own but the last token's.
    assert second["hits"] == 6 and second["cached_tokens"] == 12 + 12 + 16 + 12 + 4 + 12
    assert second["forwarded_tokens"] == sum(len(p) for p in PROMPTS) - second["cached_tokens"]


def test_rows_that_begin_alike_join_batches_together_and_samples_stay_together():
    stem = list(range(100, 100 + BLOCK_TOKENS))
    token_ids = {
        0: [1, 2, 3],
        1: [*stem, 7, 8, 9],
        2: list(range(200, 230)),
        3: [4],
        4: [*stem, 5],
        5: [*stem, 7, 8],
    }
    rows = [(i, s) for i in token_ids for s in range(2)]
    order = [item for _, item in batch_order({("autoregressive", ()): rows}, token_ids)]
    # Short rows by length; the rows of one stem together, by their tokens, where their shortest would be.
    assert order == [(3, 0), (3, 1), (0, 0), (0, 1), (4, 0), (4, 1), (5, 0), (5, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("name", ["autoregressive", "speculative", "eagle"])
def test_rows_joining_a_batch_through_the_cache_decode_as_without_it(models, name):
    """The joining rows' cache, a prefix region with holes, is merged into the running batch's."""
    strategy = registry.create(StrategyOptions(name=name, adaptive=False), models, None)
    for runner in (models.target, models.get("draft")):
        runner.prefix_cache = None
    reference, _ = _joined(strategy, PROMPTS)
    for runner in (models.target, models.get("draft")):
        runner.prefix_cache = PrefixCache(1 << 24, BLOCK)
    assert _joined(strategy, PROMPTS)[0] == reference
    assert models.target.prefix_cache.drain_counts()["cached_tokens"] > 0


def test_hidden_states_given_to_a_cached_block_keep_the_blocks_after_it():
    cache = PrefixCache(1 << 20, BLOCK)
    chain = _filled(cache, list(range(8)))
    assert cache.lookup(list(range(9)), 9, want_hidden=True) == []
    assert cache.add(None, tuple(range(4)), *_kv(0), hidden=torch.zeros(BLOCK, 3)) is chain[0]
    assert cache.lookup(list(range(9)), 9) == chain
    assert cache.lookup(list(range(9)), 9, want_hidden=True) == chain[:1]


def test_the_prefix_bench_writes_rows_that_share_the_prefix_then_differ(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = shared_prefix_prompts(["def add(a, b):", "print('hello')"], tokenizer, 5, 40, 6)
    ids = [tokenizer.encode(p) for p in prompts]
    assert len(prompts) == 5 and len(set(prompts)) == 5
    assert all(ids[0][:35] == t[:35] for t in ids)

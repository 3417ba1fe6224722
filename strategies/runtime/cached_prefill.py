"""A prefill that computes only what the runner's prefix cache (`prefix_cache.PrefixCache`) lacks.

Each prompt takes the longest cached chain of blocks it starts with, short of its last token, whose
logits choose the first generated token and so must be computed. The new cache is laid out as

    [cached prefix columns: each row's right-aligned, invalid slots before it]
    [suffix columns: the rest of each prompt, left-padded as `ModelRunner.prefill` pads]

The cached keys and values are written into the first columns and marked valid, so each row's next
position is its prefix length; the suffix columns then run through `ModelRunner.prefill`, whose
positions continue from there. Between a short prefix and a left-padded suffix lie invalid slots,
which attention never sees and positions never count (`kv_cache.RaggedKV`): a row's tokens keep
positions 0.. and see exactly the tokens before them, as in a prefill without the cache.

Rows of one batch share what they have not cached yet as well: before that prefill, each longest
block-aligned prefix that two rows start with and the cache lacks is prefilled once, alone (which
itself shares what those prefixes share), and its blocks are added; the rows then read it from the
cache. Afterwards every full block of every prompt is added, so later batches and units find them.
A runner without a cache (None) prefills as `ModelRunner.prefill` does.
"""

from __future__ import annotations

import time
from collections import Counter

import torch

from strategies.runtime.kv_cache import RaggedKV
from strategies.runtime.prefix_cache import Block, CacheCounts, PrefixCache
from strategies.runtime.runner import ForwardOutput, ModelRunner, synchronize


def prefill(runner: ModelRunner, kv: RaggedKV, prompts: list[list[int]], want_hidden: bool = False) -> ForwardOutput:
    """`ModelRunner.prefill` of `prompts` into the new cache `kv`, through the runner's prefix cache:
    logits [B, 1, V] at each row's last prompt token, and (`want_hidden`) the hidden states [B, L, H],
    row b's prompt in its last len(prompt)."""
    cache = runner.prefix_cache
    if cache is None:
        return runner.prefill(kv, prompts, want_hidden=want_hidden)
    began = time.perf_counter()
    counts = CacheCounts(prompts=len(prompts), prompt_tokens=sum(len(p) for p in prompts))
    out, cached = _prefill(runner, cache, kv, prompts, want_hidden, counts)
    synchronize(runner.device)
    counts.hits = sum(c > 0 for c in cached)
    counts.cached_tokens = sum(cached)
    counts.prefill_s = time.perf_counter() - began
    cache.count(counts)
    return out


def _prefill(
    runner: ModelRunner,
    cache: PrefixCache,
    kv: RaggedKV,
    prompts: list[list[int]],
    want_hidden: bool,
    counts: CacheCounts,
) -> tuple[ForwardOutput, list[int]]:
    """The prefill, and per prompt the tokens it read from the cache."""
    shared = shared_uncached(cache, prompts, want_hidden)
    if shared:
        _prefill(runner, cache, runner.new_kv(len(shared)), shared, want_hidden, counts)
    found = [cache.lookup(p, len(p) - 1, want_hidden) for p in prompts]
    cached = [len(chain) * cache.block_tokens for chain in found]
    if any(cached):
        _write_prefixes(kv, found)
    out = runner.prefill(kv, [p[c:] for p, c in zip(prompts, cached, strict=True)], want_hidden=want_hidden)
    counts.forwarded_tokens += sum(len(p) - c for p, c in zip(prompts, cached, strict=True))
    for row, (prompt, chain) in enumerate(zip(prompts, found, strict=True)):
        if cache.capacity_bytes:  # a cache that keeps nothing copies nothing
            _add_blocks(cache, kv, row, prompt, chain, out.hidden if want_hidden else None)
    if want_hidden and any(cached):
        out = ForwardOutput(out.logits, _prompt_hidden(prompts, found, out.hidden))
    return out, cached


def shared_uncached(cache: PrefixCache, prompts: list[list[int]], want_hidden: bool) -> list[list[int]]:
    """The longest block-aligned prefixes, short of their prompt's last token, that two or more of
    `prompts` start with and the cache lacks (none a prefix of another): what to prefill once first.
    Nothing where the cache keeps nothing, or could not keep them all."""
    size = cache.block_tokens
    if cache.capacity_bytes == 0:
        return []
    chains = [cache.chain_keys(p, (len(p) - 1) // size) for p in prompts]
    seen = Counter(key for chain in chains for key in set(chain))
    wanted = set()
    for prompt, chain in zip(prompts, chains, strict=True):
        blocks = next((i for i, key in enumerate(chain) if seen[key] < 2), len(chain))
        if blocks and len(cache.lookup(prompt, blocks * size, want_hidden)) < blocks:
            wanted.add(tuple(prompt[: blocks * size]))
    ordered = sorted(wanted)  # a prefix sorts right before the first prefix it begins
    longest = [p for i, p in enumerate(ordered) if not (i + 1 < len(ordered) and ordered[i + 1][: len(p)] == p)]
    if not cache.fits(sum(len(p) // size for p in longest)):
        return []
    return [list(p) for p in longest]


def _write_prefixes(kv: RaggedKV, found: list[list[Block]]) -> None:
    """Write each row's cached blocks into the new cache `kv`, right-aligned in as many columns as the
    longest prefix, the slots before a shorter one invalid (zero: attention adds its mask to them)."""
    widths = [sum(block.keys.shape[2] for block in chain) for chain in found]
    width = max(widths)
    valid = torch.zeros(len(found), width, dtype=torch.bool)
    by_chain: dict[int, list[int]] = {}  # a chain's last block -> the rows that read that chain
    for row, chain in enumerate(found):
        if chain:
            by_chain.setdefault(id(chain[-1]), []).append(row)
            valid[row, width - widths[row] :] = True
    if len(by_chain) == 1 and min(widths) == width:  # one chain for every row: read, not copied, here
        keys, values = _expanded(found[0], len(found))
    else:
        like = next(chain[0] for chain in found if chain)
        layers, heads, _, _ = like.keys.shape
        keys = like.keys.new_zeros(layers, len(found), heads, width, like.keys.shape[3])  # [layers, B, H, width, D]
        values = like.values.new_zeros(layers, len(found), heads, width, like.values.shape[3])
        for rows in by_chain.values():  # rows that share a chain gather it once and take it in one copy
            at, index = width - widths[rows[0]], torch.tensor(rows, device=keys.device)
            keys[:, index, :, at:], values[:, index, :, at:] = _expanded(found[rows[0]], len(rows))
    for layer, layer_keys, layer_values in zip(kv.layers, keys, values, strict=True):
        layer.update(layer_keys, layer_values)  # the one copy of the keys and values into `kv`
    kv.append(valid.to(kv.valid.device))


def _expanded(chain: list[Block], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain's keys and values, each [layers, rows, H, p, D]: one gathered copy, seen `rows` times."""
    keys = torch.cat([block.keys for block in chain], dim=2).unsqueeze(1)
    values = torch.cat([block.values for block in chain], dim=2).unsqueeze(1)
    return keys.expand(-1, rows, -1, -1, -1), values.expand(-1, rows, -1, -1, -1)


def _add_blocks(
    cache: PrefixCache,
    kv: RaggedKV,
    row: int,
    prompt: list[int],
    chain: list[Block],
    hidden: torch.Tensor | None,  # [B, S, H] the states of the last S slots of `kv`, or None
) -> None:
    """Add the full blocks of `row`'s prompt after its cached `chain` (the row's tokens after it are
    the last of its slots in `kv`), skipping those already there."""
    size, chain = cache.block_tokens, list(chain)
    block_tokens = [tuple(prompt[i * size : (i + 1) * size]) for i in range(len(prompt) // size)]
    while len(chain) < len(block_tokens):
        there = cache.child(chain[-1] if chain else None, block_tokens[len(chain)])
        if there is None or (hidden is not None and there.hidden is None):
            break
        chain.append(there)
    start = kv.num_slots - len(prompt)  # the slot of the row's token 0, were every token there
    first, end = start + len(chain) * size, start + len(block_tokens) * size
    if first < end:
        keys = torch.stack([layer.keys[row, :, first:end] for layer in kv.layers])  # [layers, H, n, D]
        values = torch.stack([layer.values[row, :, first:end] for layer in kv.layers])
        base = kv.num_slots - (hidden.shape[1] if hidden is not None else 0)  # the slot of the states' first
        states = hidden[row, first - base : end - base] if hidden is not None else None
        for offset in range(0, end - first, size):
            cut = slice(offset, offset + size)
            block = cache.add(
                chain[-1] if chain else None,
                block_tokens[len(chain)],
                keys[:, :, cut].clone(),
                values[:, :, cut].clone(),
                states[cut].clone() if states is not None else None,
            )
            if block is None:
                break
            chain.append(block)
    cache.touch(chain)


def _prompt_hidden(prompts: list[list[int]], found: list[list[Block]], suffix: torch.Tensor) -> torch.Tensor:
    """The hidden states [B, L, H] of every prompt token, row b's prompt in its last len(prompt): the
    cached blocks' and those of the suffix run (`suffix` [B, S, H], row b's suffix in its last slots)."""
    width = max(len(p) for p in prompts)
    out = suffix.new_zeros(len(prompts), width, suffix.shape[2])
    for row, (prompt, chain) in enumerate(zip(prompts, found, strict=True)):
        computed = len(prompt) - sum(block.keys.shape[2] for block in chain)
        out[row, width - computed :] = suffix[row, suffix.shape[1] - computed :]
        if chain:
            out[row, width - len(prompt) : width - computed] = torch.cat([block.hidden for block in chain])
    return out

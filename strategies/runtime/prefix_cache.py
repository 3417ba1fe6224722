"""A model runner's cache of prompt prefixes: every layer's keys and values of fixed-size token blocks,
found again by the tokens they hold, so a prefix that prompts share (a system prompt, few-shot
examples) is prefilled once per actor instead of once per row (`cached_prefill` reads and fills it).

Blocks. A block holds `block_tokens` consecutive prompt tokens from a block boundary on: keys and
values `[layers, H, block, D]` of every layer, post-RoPE at the block's absolute positions, which is
right because a cached prefix always starts at position 0. 16 tokens a block (vLLM's default): a
prompt reuses all but the last under 16 tokens of what it shares, while a 1,000-token prompt is
still only some 60 dictionary entries and 60 copies to gather. A block may also hold the target's
last hidden states `[block, H]` (what EAGLE's head reads of the prompt): a prefill that wants them
reuses only blocks that have them, and adds them to blocks that lacked them.

Keys. Block i is found under hash(key of block i - 1, its tokens): a chain, so a block's key names
its whole prefix. A hash can collide: each block keeps its tokens and the block before it (the
object, not its key), and a lookup takes a block only when both are what it walked through, so a
collision is a miss, never another prefix's keys and values.

Bound. The blocks' bytes stay within `capacity_bytes`, the least recently used evicted first. A
lookup marks the blocks it walked through used deepest first, so a chain's root is the most recent
of them and eviction takes leaves before the prefixes they extend. A block whose parent was evicted
is never found again; it waits for its own eviction. Capacity 0 keeps nothing (the counts still run).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import torch

BLOCK_TOKENS = 16


@dataclass(eq=False)
class Block:
    """One cached block: its tokens and the block before it (None: the first), and what the model computed."""

    tokens: tuple[int, ...]
    parent: Block | None
    key: int
    keys: torch.Tensor  # [layers, H, block, D]
    values: torch.Tensor  # [layers, H, block, D]
    hidden: torch.Tensor | None = None  # [block, H] the target's last hidden states, when a prefill kept them

    @property
    def nbytes(self) -> int:
        extra = self.hidden.nbytes if self.hidden is not None else 0
        return self.keys.nbytes + self.values.nbytes + extra


@dataclass
class CacheCounts:
    """What prefills through the cache did since the counts were last drained."""

    prompts: int = 0  # distinct prompts prefilled
    hits: int = 0  # of them, those that found a cached prefix
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the cache instead of computed
    forwarded_tokens: int = 0  # tokens run through the model, shared prefixes computed once included
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    prefill_s: float = 0.0  # wall time of the prefills, lookups and copies included

    def add(self, other: CacheCounts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class PrefixCache:
    """Blocks by key, least recently used first, within `capacity_bytes`."""

    capacity_bytes: int
    block_tokens: int = BLOCK_TOKENS
    nbytes: int = 0
    block_bytes: int = 0  # the last block added's bytes: what a block costs, once one was added
    _blocks: OrderedDict[int, Block] = field(default_factory=OrderedDict)
    _counts: CacheCounts = field(default_factory=CacheCounts)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0 or self.block_tokens < 1:
            raise ValueError(
                f"a prefix cache holds >= 0 bytes in blocks of >= 1 token, not {self.capacity_bytes} bytes in "
                f"blocks of {self.block_tokens}"
            )

    def __len__(self) -> int:
        return len(self._blocks)

    def chain_keys(self, prompt: list[int], blocks: int) -> list[int]:
        """The keys of the prompt's first `blocks` blocks (each full)."""
        keys, key, size = [], 0, self.block_tokens
        for i in range(blocks):
            key = block_key(key, tuple(prompt[i * size : (i + 1) * size]))
            keys.append(key)
        return keys

    def lookup(self, prompt: list[int], limit: int, want_hidden: bool = False) -> list[Block]:
        """The longest chain of cached blocks that the prompt starts with, within its first `limit`
        tokens (with hidden states, where `want_hidden`), marked used."""
        found: list[Block] = []
        parent, key, size = None, 0, self.block_tokens
        for i in range(limit // size):
            tokens = tuple(prompt[i * size : (i + 1) * size])
            key = block_key(key, tokens)
            block = self._blocks.get(key)
            if block is None or block.tokens != tokens or block.parent is not parent:
                break
            if want_hidden and block.hidden is None:
                break
            found.append(block)
            parent = block
        self.touch(found)
        return found

    def child(self, parent: Block | None, tokens: tuple[int, ...]) -> Block | None:
        """The cached block of `tokens` after `parent`, or None."""
        block = self._blocks.get(block_key(0 if parent is None else parent.key, tokens))
        return block if block is not None and block.tokens == tokens and block.parent is parent else None

    def add(
        self,
        parent: Block | None,
        tokens: tuple[int, ...],
        keys: torch.Tensor,  # [layers, H, block, D] owned by the block (not a view of a larger tensor)
        values: torch.Tensor,
        hidden: torch.Tensor | None = None,  # [block, H]
    ) -> Block | None:
        """Keep the block of `tokens` after `parent`, evicting the least recently used others to stay
        within the bound; None where the block alone does not fit, and then no block after it is worth
        adding either. A cached block that lacked hidden states is given them in place, so the blocks
        after it stay found."""
        if len(tokens) != self.block_tokens:
            raise ValueError(f"a block holds {self.block_tokens} tokens, not {len(tokens)}")
        block = self.child(parent, tokens)
        if block is not None:
            if hidden is not None and block.hidden is None and block.nbytes + hidden.nbytes <= self.capacity_bytes:
                block.hidden = hidden
                self.nbytes += hidden.nbytes
                self._blocks.move_to_end(block.key)
                self.count(CacheCounts(evicted_blocks=self._evict()))
            return block
        key = block_key(0 if parent is None else parent.key, tokens)
        block = Block(tokens, parent, key, keys, values, hidden)
        if block.nbytes > self.capacity_bytes:
            return None
        if key in self._blocks:  # another chain's block under the same key: a collision, replaced
            self._drop(key)
        self._blocks[key] = block
        self.nbytes += block.nbytes
        self.block_bytes = block.nbytes
        self.count(CacheCounts(inserted_blocks=1, evicted_blocks=self._evict()))
        return block

    def fits(self, blocks: int) -> bool:
        """Whether `blocks` more blocks (of the size last added; any count before one was) fit at all."""
        return blocks * self.block_bytes <= self.capacity_bytes and self.capacity_bytes > 0

    def count(self, counts: CacheCounts) -> None:
        with self._lock:
            self._counts.add(counts)

    def drain_counts(self) -> dict[str, int | float]:
        """The counts since the last call (a prefill on another thread may add to them meanwhile)."""
        with self._lock:
            counts, self._counts = self._counts, CacheCounts()
        found = asdict(counts)
        found["prefill_s"] = round(counts.prefill_s, 6)
        return found

    def touch(self, chain: list[Block]) -> None:
        """Mark a chain's blocks used, the deepest first: the root ends the most recent."""
        for block in reversed(chain):
            if self._blocks.get(block.key) is block:
                self._blocks.move_to_end(block.key)

    def _evict(self) -> int:
        """Drop the least recently used blocks until within the bound (the newest, which fits, stays): how many."""
        evicted = 0
        while self.nbytes > self.capacity_bytes:
            self._drop(next(iter(self._blocks)))
            evicted += 1
        return evicted

    def _drop(self, key: int) -> None:
        self.nbytes -= self._blocks.pop(key).nbytes


def block_key(parent_key: int, tokens: tuple[int, ...]) -> int:
    """A block's key: its parent's key (0 for the first block) and its tokens, hashed."""
    return hash((parent_key, tokens))


def prefix_cache_of(megabytes: float | None) -> PrefixCache | None:
    """The cache `model.prefix_cache_mb` asks for (None: none at all, not even counts)."""
    return None if megabytes is None else PrefixCache(int(megabytes * 2**20))

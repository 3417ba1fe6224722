"""A KV cache of shared slots with per-row validity: rows of one batch keep different lengths.

Design. All rows of a batch share one slot axis: a forward over `n` new tokens appends `n` slots to
every row. Which slots a row attends to is a boolean `valid[B, S]`, and a row's next position is
its count of valid slots. So

- prompts of mixed lengths are left-padded: padding slots are simply invalid;
- rolling a row back after a rejected draft is marking its rejected slots invalid — O(1) data
  movement, no copy, and rows of one step can accept different numbers of tokens;
- a tree draft writes all its nodes; the slots off the accepted path become invalid.

Invalid slots waste memory and attention work, so the cache compacts: `select_rows` drops finished
rows, trims slot columns that no remaining row uses, and `compact` gathers each row's valid slots
to the left when the waste passes a threshold. Storage is preallocated and grown by doubling, so an
append writes in place instead of concatenating the whole cache every step.

Provisional columns (self-speculation): a draft that runs the target's own first layers writes its
tokens' keys and values into those layers only, past the shared slots (`Provisional`). They are not
slots yet: the next forward over the same tokens reuses them (`ModelRunner.forward`), any other
forward, row selection or compaction drops them, so every layer again holds `num_slots` slots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

COMPACT_WASTE = 0.5  # compact when more than this share of the slots is dead


class SlotLayer(CacheLayerMixin):
    """One decoder layer's keys and values: rows `[:rows]` and slots `[:length]` of growable storage
    `[row capacity, H, slot capacity, D]`.

    Dropping rows and joining rows write into the storage held wherever it is large enough: in a job's
    continuous batch rows finish one by one and others join in their places, and a fresh tensor of
    exactly the rows and slots kept (as a gather or a concatenation gives) was copied once more by the
    next forward's append, which found no room in it."""

    is_sliding = False
    is_compileable = False

    def __init__(self) -> None:
        # The mixin's __init__ would assign `keys`/`values`, which are views of the storage here.
        self.is_initialized = False
        self._k: torch.Tensor | None = None  # [row capacity, H, slot capacity, D]
        self._v: torch.Tensor | None = None
        self.rows = 0
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def _reserve(self, rows: int, slots: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """Room for `rows` rows of `slots` slots, what is held kept: slots grow by doubling, rows to `rows`
        (a batch's rows are its size, known when it opens)."""
        have_rows, have_slots = (0, 0) if self._k is None else (self._k.shape[0], self._k.shape[2])
        if rows <= have_rows and slots <= have_slots:
            return
        new_slots = have_slots if slots <= have_slots else max(slots, 2 * have_slots, 64)
        new_rows = max(rows, have_rows)
        k = like_k.new_empty(new_rows, like_k.shape[1], new_slots, like_k.shape[3])
        v = like_v.new_empty(new_rows, like_v.shape[1], new_slots, like_v.shape[3])
        if self.length:
            k[: self.rows, :, : self.length] = self.keys
            v[: self.rows, :, : self.length] = self.values
        self._k, self._v = k, v

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, n = key_states.shape[0], key_states.shape[-2]
        self._reserve(b, self.length + n, key_states, value_states)
        self._k[:b, :, self.length : self.length + n] = key_states
        self._v[:b, :, self.length : self.length + n] = value_states
        self.rows = b
        self.length += n
        return self.keys, self.values

    @property
    def keys(self) -> torch.Tensor:
        return self._k[: self.rows, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._v[: self.rows, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # the name before transformers 5.2x

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    @torch.inference_mode()  # the storage, made by forwards, is an inference tensor: written in place here
    def join(self, other: SlotLayer, rows: int, other_rows: int, pad: int, other_pad: int) -> None:
        """Append `other`'s `other_rows` rows after this layer's `rows`, each side's slots shifted right
        by its pad of empty slots so that both hold as many. Where this side needs no pad, its rows stay
        where they are and only `other`'s are copied; otherwise both are. A side that has run no forward
        yet holds no storage; its rows are empty slots only."""
        like = self if self._k is not None else other
        if like._k is None:
            return
        width = self.length + pad
        other_k, other_v = other._held(other_rows, like)
        if pad == 0 and self._k is not None:
            self._reserve(rows + other_rows, width, like._k, like._v)
        else:
            k, v = self._held(rows, like)
            capacity = width if self._k is None else max(width, self._k.shape[2])
            self._k = like._k.new_empty(rows + other_rows, like._k.shape[1], capacity, like._k.shape[3])
            self._v = like._v.new_empty(rows + other_rows, like._v.shape[1], capacity, like._v.shape[3])
            self._write(0, k, v, pad)
        self._write(rows, other_k, other_v, other_pad)
        self.rows, self.length = rows + other_rows, width

    def _write(self, first: int, k: torch.Tensor, v: torch.Tensor, pad: int) -> None:
        """Rows `k`, `v` [n, H, S, D] into storage rows `first` on, after `pad` zero slots: a padding slot
        is masked, and a masked score is the key's dot product plus the mask (stale storage could be NaN)."""
        end, width = first + k.shape[0], pad + k.shape[2]
        self._k[first:end, :, :pad] = 0
        self._v[first:end, :, :pad] = 0
        self._k[first:end, :, pad:width] = k
        self._v[first:end, :, pad:width] = v

    def keep_block(self, first: int, width: int, index: torch.Tensor | None) -> None:
        """Keep `width` slots from `first` on and drop the rest: per row, slots `first + index[b]`
        ([B, width], in order) moved there; `index=None`: the slots already there (a cut)."""
        if self._k is None:
            return
        if index is not None:
            at = index[:, None, :, None]  # [B, 1, width, 1]
            for storage in (self._k, self._v):
                block = storage[: self.rows, :, first : self.length]  # [B, H, W, D]
                # Gathered into a new tensor before the write: the slots written may be among those read.
                moved = block.gather(2, at.expand(-1, block.shape[1], -1, block.shape[3]))  # [B, H, width, D]
                storage[: self.rows, :, first : first + width] = moved
        self.length = first + width

    def _held(self, rows: int, like: SlotLayer) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [rows, H, length, D]; [rows, H, 0, D] shaped as `like`'s before a forward."""
        if self._k is not None:
            return self.keys, self.values
        return tuple(t.new_zeros(rows, t.shape[1], 0, t.shape[3]) for t in (like._k, like._v))

    @torch.inference_mode()
    def select(self, rows: list[int], first: int = 0) -> None:
        """Keep `rows` (indices) and their slots from `first` on, written over the storage's first rows where
        it holds them all. Rows that only move up (finished rows dropped, every slot kept) are copied one by
        one, each over an earlier or its own place, and those already in place not at all: a finished row's
        followers move up one place each."""
        if self._k is None:
            return
        kept = len(rows)
        if first == 0 and all(a < b for a, b in itertools.pairwise(rows)):
            for place, row in enumerate(rows):
                if row != place:
                    self._k[place, :, : self.length] = self._k[row, :, : self.length]
                    self._v[place, :, : self.length] = self._v[row, :, : self.length]
            self.rows = kept
            return
        index = torch.tensor(rows, dtype=torch.long, device=self._k.device)
        k, v = self.keys[index, :, first:], self.values[index, :, first:]  # gathered copies [B', H, S, D]
        if kept > self._k.shape[0]:  # more rows than held (a row's lanes, side by side): a new storage
            self._k = k.new_empty(kept, k.shape[1], self._k.shape[2], k.shape[3])
            self._v = v.new_empty(kept, v.shape[1], self._v.shape[2], v.shape[3])
        self._k[:kept, :, : k.shape[2]] = k
        self._v[:kept, :, : v.shape[2]] = v
        self.rows, self.length = kept, k.shape[2]

    @torch.inference_mode()
    def gather_slots(self, order: torch.Tensor) -> None:
        """Keep, per row, the slots `order` [B, S'] names, in that order, at the storage's front: one row at a
        time (a one-dimensional index per row is cheaper than one four-dimensional gather)."""
        if self._k is None:
            return
        width = order.shape[1]
        for row, slots in enumerate(order):
            for storage in (self._k, self._v):
                storage[row, :, :width] = storage[row, :, : self.length].index_select(1, slots)
        self.length = width


@dataclass
class Provisional:
    """Columns written past the shared slots into the first `layers` layers only, by one draft."""

    layers: int
    ids: torch.Tensor  # [B, m] the token of each column
    positions: torch.Tensor  # [B, m]
    valid: torch.Tensor  # [B, m] bool: False for padding
    hidden: torch.Tensor  # [B, m, D] the residual stream entering layer `layers` at each column

    @property
    def count(self) -> int:
        return self.ids.shape[1]


class RaggedKV:
    """The cache of one batch: shared slots, per-row validity and per-row next position."""

    def __init__(self, num_layers: int, batch_size: int, device: torch.device) -> None:
        self.layers = [SlotLayer() for _ in range(num_layers)]
        self.cache = Cache(layers=self.layers)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, S]
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.provisional: Provisional | None = None

    def add_provisional(self, columns: Provisional) -> None:
        """Record columns a forward of the first `columns.layers` layers just wrote past the slots."""
        prov = self.provisional
        if prov is None:
            self.provisional = columns
            return
        self.provisional = Provisional(
            prov.layers,
            torch.cat([prov.ids, columns.ids], dim=1),
            torch.cat([prov.positions, columns.positions], dim=1),
            torch.cat([prov.valid, columns.valid], dim=1),
            torch.cat([prov.hidden, columns.hidden], dim=1),
        )

    def keep_provisional(self, count: int) -> None:
        """Keep only the first `count` provisional columns (0: none), in the record and in the layers."""
        prov = self.provisional
        if prov is None:
            return
        for layer in self.layers[: prov.layers]:
            layer.length = self.num_slots + count
        if count == 0:
            self.provisional = None
        else:
            self.provisional = Provisional(
                prov.layers,
                prov.ids[:, :count],
                prov.positions[:, :count],
                prov.valid[:, :count],
                prov.hidden[:, :count],
            )

    def drop_provisional(self) -> None:
        """Forget every provisional column: each layer holds `num_slots` slots again."""
        self.keep_provisional(0)

    @property
    def num_slots(self) -> int:
        return self.valid.shape[1]

    def append(self, new_valid: torch.Tensor) -> None:
        """Record the slots a forward just wrote: `new_valid` [B, n]."""
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.next_pos += new_valid.sum(dim=1)

    @torch.inference_mode()  # the mask, made by forwards, is an inference tensor: updated in place here
    def invalidate(self, slots: torch.Tensor, first: int = 0) -> None:
        """Roll rows back: `slots` [B, S - first] marks the valid slots from slot `first` on that no
        longer belong to their row (a verify step names its own slots only: the rest cannot change)."""
        tail = self.valid[:, first:]  # [B, S - first] a view: the mask is updated in place
        self.next_pos -= (slots & tail).sum(dim=1)
        tail &= ~slots

    @torch.inference_mode()
    def keep_paths(self, first: int, kept: list[list[int]]) -> None:
        """Roll rows back to the slots `kept` names of the block a forward wrote from slot `first` on
        (per row, increasing offsets into the block, at least one), each row's moved to the block's
        front in order and the block cut to the longest row's: a rolled-back row leaves no dead slots
        behind it. One row's verify step then leaves the cache dense, and a plain step over a dense
        cache of one row needs no mask, which a forward over a cache with holes pays for at every
        step. A chain's kept slots are the block's first ones: a cut,
        nothing copied. Attention sees a row's slots as a set (each key carries its own rotation), so
        moving them changes no logit."""
        self.drop_provisional()
        width = max(len(slots) for slots in kept)
        index = None
        if any(slots != list(range(len(slots))) for slots in kept):  # a shorter row repeats its last slot
            index = [slots + slots[-1:] * (width - len(slots)) for slots in kept]
            index = torch.tensor(index, device=self.valid.device)
        for layer in self.layers:
            layer.keep_block(first, width, index)
        block = [[True] * len(slots) + [False] * (width - len(slots)) for slots in kept]
        block = torch.tensor(block, device=self.valid.device)  # [B, width] each row's kept slots
        self.next_pos -= self.valid[:, first:].sum(dim=1) - block.sum(dim=1)
        self.valid = torch.cat([self.valid[:, :first], block], dim=1)

    def truncate(self, num_slots: int) -> None:
        """Drop every slot from `num_slots` on: a forward that was only read (a masked LM's block pass)."""
        self.drop_provisional()
        for layer in self.layers:
            layer.length = num_slots
        self.next_pos -= self.valid[:, num_slots:].sum(dim=1)
        self.valid = self.valid[:, :num_slots]

    def extend(self, other: RaggedKV) -> None:
        """Rows of `other` join after this cache's rows (continuous batching). The side with fewer slots
        is padded on the left with invalid slots; positions are per row, so no row sees a change."""
        self.drop_provisional()
        other.drop_provisional()
        width = max(self.num_slots, other.num_slots)
        pad, other_pad = width - self.num_slots, width - other.num_slots
        rows, other_rows = self.valid.shape[0], other.valid.shape[0]
        for layer, joining in zip(self.layers, other.layers, strict=True):
            layer.join(joining, rows, other_rows, pad, other_pad)
        self.valid = torch.cat([_pad_slots(self.valid, pad), _pad_slots(other.valid, other_pad)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` [B'] (indices, in order) and drop slot columns no kept row uses."""
        self.drop_provisional()
        valid = self.valid[rows]  # [B', S]
        used = valid.any(dim=0)
        first = int(used.int().argmax()) if bool(used.any()) else valid.shape[1]
        if first > 0:
            valid = valid[:, first:]
        kept = rows.tolist()
        for layer in self.layers:
            layer.select(kept, first)
        self.valid = valid
        self.next_pos = self.next_pos[rows]

    def waste(self) -> float:
        """Share of slots that no row attends to: a row's valid slots are its next position, so the
        count is a sum over rows, not over every slot (this runs after every verify step)."""
        return 1.0 - int(self.next_pos.sum()) / self.valid.numel() if self.valid.numel() else 0.0

    def compact_if_wasteful(self) -> None:
        """Compact once dead slots pass `COMPACT_WASTE`: a compaction copies the whole cache, worth it
        only when much of it is dead."""
        if self.waste() > COMPACT_WASTE:
            self.compact()

    def compact(self) -> None:
        """Move each row's valid slots to the left, in order, and drop the columns freed."""
        self.drop_provisional()
        keep = int(self.valid.sum(dim=1).max()) if self.valid.numel() else 0
        # A stable sort of "invalid" puts valid slots first and keeps their order.
        order = torch.sort((~self.valid).int(), dim=1, stable=True).indices[:, :keep]  # [B, keep]
        for layer in self.layers:
            layer.gather_slots(order)
        self.valid = self.valid.gather(1, order)


def _pad_slots(x: torch.Tensor, pad: int) -> torch.Tensor:
    """`x` with `pad` empty (zero / False) slots before its first: slots are dim 2 of keys and values
    [B, H, S, D], dim 1 of validity [B, S]."""
    if pad == 0:
        return x
    dim = 1 if x.dim() == 2 else 2
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x.new_zeros(shape), x], dim=dim)

"""How a runner readies the lean forward's matmuls before decoding: the kernel of each row count.

`linear` runs a matmul with one of several kernels (`linear.kernels()`), and which is fastest depends
on the CPU and on the row count, so it is not assumed: a runner times whole forwards with each kernel
and gives each row count the fastest (`pack_where_faster`), then builds and packs the weights of the
choice (`warm_up`, `prepack`) so that the first steps, which the adaptive controller explores with, do
not pay for it. A matmul timed alone in a loop keeps its weight in the caches, which a forward's weights
do not stay in, so only whole forwards are timed. `forward_seconds` times forwards the same way for
the cost model.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch

from strategies.runtime import linear, llama_forward
from strategies.runtime.kv_cache import RaggedKV

# Widths of the verify forwards warmed up: one plus the largest tree a strategy's options commonly ask for (16 nodes).
WARM_WIDTHS = 17
# Each of `linear.kernels()` is timed with whole forwards of these widths over the batch and over one row
# (the last, one row only, stands for a prefill's row counts), over `PACKING_CONTEXT` cached tokens, the
# kernels taking turns for `PACKING_ROUNDS` rounds; each row count takes the kernel of the fastest forward
# (the machine's noise only ever adds time, so the fastest is the least disturbed). Widths a factor of 2
# apart: at the few rows of verify forwards the kernels' order changes from one row count to the next, and
# where rows are many they come close to each other, so a finer grid costs start-up time for little.
PACKING_WIDTHS = (1, 2, 4, 8, 16)
PACKING_MAX_ROWS = 256  # wider forwards over the batch are not timed: their row counts take the nearest timed one's
PACKING_PREFILL_WIDTH = 64
PACKING_CONTEXT = 16
PACKING_ROUNDS = 3
# A round after the first only while the timing so far took less than this: a round of a 0.5B model's
# forwards takes some 15 s on one core in float32 (each kernel's copies made, each width run twice),
# where its forwards are long enough that one round's noise is small beside what parts the kernels,
# and a job's actor pays for every round as it starts.
PACKING_BUDGET_S = 5.0


def decode_row_counts(batch_size: int) -> list[int]:
    """Row counts of the matmuls of steps `WARM_WIDTHS` tokens wide or less, over one row or `batch_size` rows."""
    return sorted({rows * width for rows in (1, batch_size) for width in range(1, WARM_WIDTHS + 1)})


class KernelTiming:
    """The warm-up and forward timing of `runner.ModelRunner`, which it inherits: this class runs the
    runner's `new_kv`, `prefill` and `forward`, and reads its model, device, dtype and lean forward."""

    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    max_context: int
    _fast: llama_forward.LlamaForward | None

    @property
    def _forward_packs(self) -> bool:
        """Whether this model's matmuls go through `linear`'s packed weights: the lean forward's only."""
        return self._fast is not None and linear.packs_on(self.device, self.dtype)

    @property
    def packed_weight_bytes(self) -> int:
        """Bytes of the weights that `linear` keeps packed for this model beside its own: the lean forward's
        (the whole model's size); 0 where none are (another kind of model runs its own `nn.Linear`s,
        another device or dtype, packing off, or no row count packed by the choice `warm_up` made)."""
        if not self._forward_packs or not linear.packs_anywhere():
            return 0
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def warm_up(self, batch_size: int, plain_steps_only: bool = False) -> None:
        """Build oneDNN's kernels for the row counts decoding at `batch_size` meets most (`linear.warm_up`):
        a step of one row and of the whole batch, each `WARM_WIDTHS` tokens wide or less. Nothing for a
        model whose forward does not pack. `plain_steps_only`: the kernel of a plain step over the batch
        alone, all a step's timing needs (`model.dtype=auto` times one in each dtype, then readies the
        one chosen whole)."""
        if not self._forward_packs:
            return
        weights = self._lean_weights()
        linear.warm_up(weights, [batch_size] if plain_steps_only else decode_row_counts(batch_size))
        linear.pack_by_rows(self.pack_where_faster(batch_size, plain_steps_only))
        self.prepack()

    def prepack(self) -> None:
        """Pack the lean forward's weights now for every kernel the current choice runs (`linear.prepack`),
        not at the first step that needs each: for the target, its first drafting step; for a draft
        model, its first draft, which the adaptive controller explores it with. Nothing for a model whose
        forward does not pack."""
        if self._forward_packs:
            linear.prepack(self._lean_weights())

    def _lean_weights(self) -> list[torch.Tensor]:
        """The lean forward's matmul weights: the LM head, then each layer's."""
        weights = [self._fast.lm_head]
        for layer in self._fast.layers:
            weights += [layer.w_qkv, layer.w_o, layer.w_gate_up, layer.w_down]
        return weights

    def pack_where_faster(self, batch_size: int, plain_steps_only: bool = False) -> dict[int, str]:
        """Per row count of `PACKING_WIDTHS`-wide forwards over `batch_size` rows and over one, and of a
        prefill-like one-row forward (`plain_steps_only`: of a one-token forward over the batch alone):
        the kernel of `linear.kernels()` (F.linear, oneDNN's packed weights, MKL's, F.linear's arithmetic
        over a transposed copy) whose whole forwards ran fastest (`kernel_seconds`; `linear.pack_by_rows`
        takes it). Timed, not assumed: which wins depends on the CPU and the row count
        (`strategies/runtime/linear.py`)."""
        one_row = (*PACKING_WIDTHS, PACKING_PREFILL_WIDTH)
        if self.max_context < PACKING_CONTEXT + PACKING_PREFILL_WIDTH:
            one_row = PACKING_WIDTHS  # a model of few positions: no prefill-like forward
        context = min(PACKING_CONTEXT, self.max_context - max(one_row))
        if context < 1:
            return {}
        shapes = {1: one_row}  # rows -> widths
        if plain_steps_only:
            shapes = {batch_size: (1,)}
        elif batch_size > 1:
            shapes[batch_size] = tuple(w for w in PACKING_WIDTHS if w == 1 or batch_size * w <= PACKING_MAX_ROWS)
        choice: dict[int, str] = {}
        for rows, widths in shapes.items():
            contexts = synthetic_contexts(rows, context, self.vocab_size)
            timed = self.kernel_seconds(contexts, widths, linear.kernels(self.dtype), PACKING_ROUNDS)
            for width in widths:
                choice[rows * width] = min(linear.kernels(self.dtype), key=lambda kernel: min(timed[width, kernel]))
        return choice

    @torch.inference_mode()
    def kernel_seconds(
        self, contexts: list[list[int]], widths: Sequence[int], kernels: Sequence[str], rounds: int
    ) -> dict[tuple[int, str], list[float]]:
        """Per width n and kernel of `kernels`, the seconds of up to `rounds` forwards of n new tokens per
        row (as `forward_seconds`) with that kernel at every row count, over one cache: a round after the
        first only while the rounds so far took less than `PACKING_BUDGET_S`. The kernels take
        turns, a forward of each width at a turn, so that the machine's drift falls on each alike. A
        kernel's copies are made as its turn begins and dropped as it ends (one copy of the weights in
        memory besides them, as in decoding: a model of some GB has no room for four), and at its first
        turn each width runs once untimed (allocations, oneDNN's build of a row count). The kernel choice
        in force before is in force after."""
        before = linear.choice()
        kv = self.new_kv(len(contexts))
        self.prefill(kv, contexts)
        chains = {width: self._chain(kv, width) for width in widths}
        seconds: dict[tuple[int, str], list[float]] = {}
        started = time.perf_counter()
        try:
            for turn in range(rounds):
                if turn and time.perf_counter() - started >= PACKING_BUDGET_S:
                    break
                for kernel in kernels:
                    linear.pack_by_rows({1: kernel})  # this kernel alone, at every row count
                    self.prepack()
                    for width, chain in chains.items():
                        if turn == 0:
                            self._timed_forward(kv, *chain)
                        seconds.setdefault((width, kernel), []).append(self._timed_forward(kv, *chain))
        finally:
            linear.pack_by_rows(before)
        return seconds

    @torch.inference_mode()
    def forward_seconds(self, contexts: list[list[int]], widths: Sequence[int], repeats: int) -> dict[int, list[float]]:
        """Per width n, the seconds of each of `repeats` forwards of n new tokens per row (a chain, every
        slot's logits kept, as a verify forward) over the cache `contexts` leave, rolled back after each;
        a first forward of each width, which allocates, runs untimed."""
        kv = self.new_kv(len(contexts))
        self.prefill(kv, contexts)
        seconds: dict[int, list[float]] = {}
        for width in widths:
            chain = self._chain(kv, width)
            seconds[width] = [self._timed_forward(kv, *chain) for _ in range(repeats + 1)][1:]
        return seconds

    def _chain(self, kv: RaggedKV, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs of a timed forward: `width` new tokens per row of `kv` as a chain (ids, positions, valid)."""
        rows = kv.valid.shape[0]
        ids = torch.randint(0, min(100, self.vocab_size), (rows, width), device=self.device)
        positions = kv.next_pos[:, None] + torch.arange(width, device=self.device)
        valid = torch.ones(rows, width, dtype=torch.bool, device=self.device)
        return ids, positions, valid

    def _timed_forward(self, kv: RaggedKV, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> float:
        """Seconds of one forward of `ids` over `kv`, which is rolled back to its slots before it after."""
        before = kv.num_slots
        synchronize(self.device)
        started = time.perf_counter()
        self.forward(kv, ids, positions, valid)
        synchronize(self.device)
        spent = time.perf_counter() - started
        kv.truncate(before)
        return spent


@functools.lru_cache(maxsize=64)
def synthetic_contexts(rows: int, length: int, vocab_size: int) -> list[list[int]]:
    """`rows` distinct token sequences of `length`, a cache to time forwards over."""
    return [[(row + t) % vocab_size for t in range(length)] for row in range(rows)]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), so a timer around it times the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""`linear`: what `F.linear` computes, with float32 inference on CPU through weights packed once for oneDNN.

Why: a decode step's matmuls have few rows (batch × new tokens: 1 to some 40), and float32 `F.linear`
on CPU goes to MKL's sgemm, which packs the weight again on every call (and on AMD CPUs may not take
their fastest path). oneDNN's linear over a weight reordered once for it does neither. On a 2-core AMD
EPYC, all of the shipped target's matmuls of one forward (six layers' fused Q/K/V, output, gate/up and
down weights, then the LM head; 2 threads) took 0.73 ms against 0.70-0.79 with `F.linear` for one row,
0.80-1.02 against 2.6-2.7 ms for 9 rows and 7.4-7.5 against 19.0-19.6 ms for 200 (a prefill); whole
decoding ran 1.3-1.5x faster (README, "Weights packed for oneDNN"). Unlike MKL's packed sgemm, one
packed copy serves every row count, so a decode that mixes widths (plain steps, drafts of any size,
prefills) keeps one copy of each weight in the caches.

The packed copy is kept beside the weight, made at the weight's first use and again when it changes
in place (its version counter, which views and `detach` share); a weight whose tensor dies (for a
slice, the tensor it views) takes its copy with it. Anything else (float64, bfloat16, GPU, a weight
or input that needs gradients, code being compiled by `torch.compile`) is `F.linear` itself: the
float64 equivalence tests run the same arithmetic as before. Packing costs a second copy of each
weight in memory; `set_packing(False)` (`model.pack_weights=false`) turns it off.

oneDNN builds the kernel of a matmul for each row count it meets, once: on a 2-core AMD EPYC the
first forward of the shipped target at a new row count took some 2.5 ms more than the next (a plain
step at batch 1 takes about 2). A decode meets a few dozen row counts (batch × its draft's width), so
the cost is small over a job, but it falls on the first steps of each drafter at each width, which
are the steps the adaptive controller explores with: a Lookahead explored cold measured 2.2 plain
steps a step against 1.6 warm, and was written off. `warm_up` pays it once, before decoding.

Which of the two is faster depends on the CPU and the row count: on a 2-core Intel Xeon the shipped
target's whole forward at one row took 1.37 ms with `F.linear` against 2.29 ms packed, and the two met
at some 500 rows. So packing is chosen per row count (`pack_by_rows`), from whole forwards timed both
ways as a runner warms up (`ModelRunner.pack_where_faster`): a matmul's own timing in a loop keeps its
weight in the caches, which a forward's 27 MB of weights do not stay in, and so misjudges it.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F

# The reorder's row-count hint: hints of 8 and 32 timed alike from 1 to 200 rows; a hint of 1 made 9
# rows 2-3x slower.
_ROWS_HINT = 16

# (data pointer, shape, strides) -> (the weight tensor's weak reference, its version, packed copy)
_packed: dict[tuple, tuple[weakref.ref, int, torch.Tensor]] = {}
_enabled = torch.backends.mkldnn.is_available()
# The row counts timed by `pack_by_rows`, each with whether packed matmuls ran faster there, sorted; a
# row count between them takes its nearest one's choice (`packs_nearest`). Empty: pack at every row count.
_by_rows: tuple[tuple[int, bool], ...] = ()
_chosen: dict[int, bool] = {}  # each row count met since, with its choice: one lookup a call


def set_packing(enabled: bool) -> None:
    """Turn packed float32 CPU linears on or off for this process (off where oneDNN is not built in)."""
    global _enabled
    _enabled = enabled and torch.backends.mkldnn.is_available()
    if not _enabled:
        _packed.clear()


def packing() -> bool:
    """Whether float32 CPU linears go through packed weights in this process."""
    return _enabled


def pack_by_rows(choices: dict[int, bool]) -> None:
    """Pack the matmuls of each row count as the nearest of `choices` says ({rows: packed is faster});
    {}: at every row count. Whether packing is on at all stays `set_packing`'s."""
    global _by_rows
    _by_rows = tuple(sorted(choices.items()))
    _chosen.clear()
    if not packs_anywhere():
        _packed.clear()  # no row count runs them: their memory goes back


def packs_anywhere() -> bool:
    """Whether any row count runs packed matmuls under the current choice (all do before one is made)."""
    return not _by_rows or any(packs for _, packs in _by_rows)


def packs_nearest(choices: tuple[tuple[int, bool], ...], rows: int) -> bool:
    """The choice of the row count nearest `rows` by ratio (ties: the larger), True where none is known."""
    if not choices:
        return True
    return min(choices, key=lambda choice: (abs(math.log(choice[0] / max(rows, 1))), -choice[0]))[1]


def packs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` runs its inference matmuls through packed weights here."""
    return _enabled and device.type == "cpu" and dtype == torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b: `x` [..., K], `weight` [N, K], `bias` [N] -> [..., N]."""
    if not _packs(x, weight, bias) or not _packs_rows(x.numel() // max(x.shape[-1], 1)):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, _packed_copy(weight), bias, "none", [None], "")


def warm_up(weights: Iterable[torch.Tensor], rows: Iterable[int]) -> None:
    """Run each weight's packed matmul once at every row count of `rows` (zeros in, nothing kept), so
    that oneDNN has built those kernels before decoding meets them; nothing where the weights do not pack.
    Kernels are shared by weights of one shape, so one weight of each shape is enough."""
    by_shape = {tuple(w.shape): w for w in weights}
    counts = sorted(set(rows))
    with torch.inference_mode():
        for weight in by_shape.values():
            for count in counts:
                x = torch.zeros(count, weight.shape[1], dtype=weight.dtype, device=weight.device)
                if _packs(x, weight, None):
                    linear(x, weight)


def _packs_rows(rows: int) -> bool:
    chosen = _chosen.get(rows)
    if chosen is None:
        chosen = _chosen[rows] = packs_nearest(_by_rows, rows)
    return chosen


def _packs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if torch.compiler.is_compiling():  # `model.compile`: inductor picks the compiled graph's own kernels
        return False
    if not _enabled or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        return False
    if weight.dim() != 2 or (bias is not None and bias.dtype != torch.float32):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def _packed_copy(weight: torch.Tensor) -> torch.Tensor:
    key = (weight.data_ptr(), tuple(weight.shape), weight.stride())
    version = 0 if weight.is_inference() else weight._version  # inference tensors change only in inference mode
    entry = _packed.get(key)
    if entry is not None and entry[0]() is not None and entry[1] == version:
        return entry[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _ROWS_HINT)

    def forget(ref: weakref.ref, key: tuple = key) -> None:
        if _packed.get(key, (None,))[0] is ref:  # not a newer weight's entry at the same address
            del _packed[key]

    # A slice taken at each call (a CMLM head's rows) dies with the call; the tensor it views does not.
    owner = weight if weight._base is None else weight._base
    _packed[key] = (weakref.ref(owner, forget), version, packed)
    return packed

"""`linear`: what `F.linear` computes, with float32 and bfloat16 inference on CPU through a kernel chosen
per row count.

Why: a decode step's matmuls have few rows (batch × new tokens: 1 to some 40), and float32 `F.linear`
on CPU goes to MKL's sgemm, which packs the weight again on every call (and on AMD CPUs may not take
their fastest path); bfloat16 `F.linear` reads its weight in a layout the CPU's bfloat16 instructions
(AVX512-BF16, AMX) do not take as it is. A weight packed once spares that on every step. The kernels
(`kernels()`):

- `F_LINEAR`: `F.linear` itself.
- `ONEDNN`: oneDNN's linear over a weight reordered once for it. Unlike MKL's packed sgemm, one packed
  copy serves every row count, so a decode that mixes widths (plain steps, drafts of any size,
  prefills) keeps one copy of each weight in the caches.
- `MKL`, where torch is built with MKL, float32 only: MKL's own packed sgemm (`cblas_sgemm_compute` over a weight
  packed once). MKL documents a pack as made for the dimensions it is packed with; one copy is used
  for every row count, so `warm_up` checks on the CPU at hand that it gives `F.linear`'s results at
  the row counts decoding meets (`mkl_agrees`) before the kernel may be chosen.
- `TRANSPOSED`: the same sgemm as `F.linear` over a copy of the weight stored transposed, [K, N], so
  that the matmul reads it row by row without a transpose flag; on some CPUs the fastest at one or two
  rows.

Which is fastest depends on the CPU and the row count, and among the few rows of verify forwards
their order changes from one row count to the next. So the kernel is chosen per row count
(`pack_by_rows`), from whole forwards timed each way as a runner warms up
(`kernel_timing.KernelTiming.pack_where_faster`): a matmul's own timing in a loop keeps its weight in
the caches, which a forward's weights do not stay in, and so misjudges it.

The packed copy is kept beside the weight, made at the weight's first use and again when it changes
in place (its version counter, which views and `detach` share); a weight whose tensor dies (for a
slice, the tensor it views) takes its copy with it. Anything else (float64, float16, GPU, a weight
or input that needs gradients, code being compiled by `torch.compile`) is `F.linear` itself: the
float64 equivalence tests run the same arithmetic as before. Packing costs a second copy of each
weight in memory; `set_packing(False)` (`model.pack_weights=false`) turns it off.

oneDNN builds the kernel of a matmul for each row count it meets, once, at a cost of the order of a
plain step. A decode meets a few dozen row counts (batch × its draft's width), so the cost is small
over a job, but it falls on the first steps of each drafter at each width, which are the steps the
adaptive controller explores with: a drafter explored cold looks slower than it is, and may be
written off. `warm_up` pays it once, before decoding.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F

# The reorder's row-count hint: a hint within the row counts decoding meets serves them all alike; a
# hint of 1 slows the wider ones.
_ROWS_HINT = 16

F_LINEAR, ONEDNN, MKL, TRANSPOSED = "f_linear", "onednn", "mkl", "transposed"  # the kernels a row count may be given

# (kernel, data pointer, shape, strides) -> (the weight tensor's weak reference, its version, packed copy)
_packed: dict[tuple, tuple[weakref.ref, int, torch.Tensor]] = {}
_enabled = torch.backends.mkldnn.is_available()
# The dtypes whose CPU matmuls may run packed: bfloat16 only where oneDNN runs it on this CPU.
_BF16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
_DTYPES = (torch.float32, torch.bfloat16) if _BF16 else (torch.float32,)
# Whether MKL's packed sgemm is built in and, once `warm_up` has checked it (`mkl_agrees`), computes F.linear.
_mkl_ok = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
# The row counts timed by `pack_by_rows`, each with the kernel that ran its whole forwards fastest, sorted;
# a row count between them takes its nearest one's (`kernel_nearest`). Empty: oneDNN at every row count.
_by_rows: tuple[tuple[int, str], ...] = ()
_chosen: dict[int, str] = {}  # each row count met since, with its kernel: one lookup a call


def set_packing(enabled: bool) -> None:
    """Turn packed float32 and bfloat16 CPU linears on or off for this process (off where oneDNN is not built in)."""
    global _enabled
    _enabled = enabled and torch.backends.mkldnn.is_available()
    if not _enabled:
        _packed.clear()


def packing() -> bool:
    """Whether float32 and bfloat16 CPU linears go through packed weights in this process."""
    return _enabled


def pack_by_rows(choices: dict[int, str]) -> None:
    """Run the matmuls of each row count with the kernel of the nearest of `choices` ({rows: kernel});
    {}: oneDNN's at every row count. Whether packing is on at all stays `set_packing`'s."""
    global _by_rows
    _by_rows = tuple(sorted(choices.items()))
    _chosen.clear()
    kept = _kernels_in_use()
    for key in [key for key in _packed if key[0] not in kept]:
        del _packed[key]  # no row count runs that kernel: its copies' memory goes back


def choice() -> dict[int, str]:
    """The choice in force (`pack_by_rows`): {rows: kernel}, {} where none was made."""
    return dict(_by_rows)


def _kernels_in_use() -> set[str]:
    """The kernels some row count runs under the current choice (`pack_by_rows`)."""
    return {kernel for _, kernel in _by_rows} if _by_rows else {ONEDNN}


def prepack(weights: Iterable[torch.Tensor]) -> None:
    """Make each weight's packed copy for every packing kernel the current choice runs, now: otherwise
    the first matmul of a row count that runs it packs the weight. Where verify widths run a packing
    kernel and plain steps do not, that is the first drafting step of every job, packing every weight
    of the model (the cost of a few plain steps), and that step is the one the adaptive controller
    explores a drafter with, against its budget."""
    packing_kernels = _kernels_in_use() & {ONEDNN, MKL, TRANSPOSED}
    with torch.inference_mode():
        for weight in weights:
            if packing_kernels and _packs(weight[:1], weight, None):
                for kernel in sorted(packing_kernels & set(kernels(weight.dtype))):
                    _packed_copy(weight, kernel)


def packs_anywhere() -> bool:
    """Whether any row count runs packed matmuls under the current choice (all do before one is made)."""
    return not _by_rows or any(kernel != F_LINEAR for _, kernel in _by_rows)


def kernels(dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The kernels a row count of `dtype` may be given here: MKL's packed sgemm only in float32, where it
    is built in and has not been found to differ from F.linear (`mkl_agrees`)."""
    mkl = _mkl_ok and dtype == torch.float32
    return (F_LINEAR, ONEDNN, MKL, TRANSPOSED) if mkl else (F_LINEAR, ONEDNN, TRANSPOSED)


def kernel_nearest(choices: tuple[tuple[int, str], ...], rows: int) -> str:
    """The kernel of the row count nearest `rows` by ratio (ties: the larger), oneDNN's where none is known."""
    if not choices:
        return ONEDNN
    return min(choices, key=lambda choice: (abs(math.log(choice[0] / max(rows, 1))), -choice[0]))[1]


def packs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` in `dtype` runs its inference matmuls through packed weights here."""
    return _enabled and device.type == "cpu" and dtype in _DTYPES


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b: `x` [..., K], `weight` [N, K], `bias` [N] -> [..., N]."""
    if not _packs(x, weight, bias):
        return F.linear(x, weight, bias)
    rows = x.numel() // max(x.shape[-1], 1)
    kernel = _kernel(rows)
    if kernel == MKL and x.dtype != torch.float32:  # a float32 model's choice, met by a bfloat16 one
        kernel = ONEDNN
    if kernel == MKL and rows:  # its pack serves every row count (`mkl_agrees`): told this one
        return torch.ops.mkl._mkl_linear(x, _packed_copy(weight, MKL), weight, bias, rows)
    if kernel == TRANSPOSED:
        return _transposed(x, weight, bias)
    return _onednn(x, weight, bias) if kernel == ONEDNN else F.linear(x, weight, bias)


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, _packed_copy(weight, ONEDNN), bias, "none", [None], "")


def _transposed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x Wᵀ + b as a plain matmul over the copy of W stored transposed, [K, N]."""
    flat = x.reshape(-1, x.shape[-1])  # [rows, K]
    weight_t = _packed_copy(weight, TRANSPOSED)  # [K, N]
    out = torch.mm(flat, weight_t) if bias is None else torch.addmm(bias, flat, weight_t)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def warm_up(weights: Iterable[torch.Tensor], rows: Iterable[int]) -> None:
    """Run each weight's oneDNN-packed matmul once at every row count of `rows` (zeros in, nothing kept),
    so that oneDNN has built those kernels before decoding meets them, and check MKL's packed sgemm at
    them (`mkl_agrees`); nothing where the weights do not pack. Kernels are shared by weights of one
    shape, so one weight of each shape is enough."""
    global _mkl_ok
    by_shape = {tuple(w.shape): w for w in weights}
    counts = sorted(set(rows))
    with torch.inference_mode():
        for weight in by_shape.values():
            for count in counts:
                x = torch.zeros(count, weight.shape[1], dtype=weight.dtype, device=weight.device)
                if _packs(x, weight, None):
                    _onednn(x, weight, None)  # not `linear`: a choice made for another batch size may skip oneDNN
        float32 = [w for w in by_shape.values() if w.dtype == torch.float32 and _packs(w[:1], w, None)]
        _mkl_ok = _mkl_ok and all(mkl_agrees(w, counts) for w in float32)


def mkl_agrees(weight: torch.Tensor, rows: Iterable[int]) -> bool:
    """Whether MKL's packed sgemm over one packed copy of `weight` [N, K] computes F.linear (to float32
    rounding) at every row count of `rows`, on random inputs: the one copy for every row count that
    `linear` relies on is not a documented property of MKL's packing."""
    generator = torch.Generator().manual_seed(0)
    packed = _packed_copy(weight, MKL)
    for count in rows:
        x = torch.randn(count, weight.shape[1], generator=generator, dtype=weight.dtype)
        expected = F.linear(x, weight)
        got = torch.ops.mkl._mkl_linear(x, packed, weight, None, count)
        if not torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * (1 + expected.abs().max().item())):
            return False
    return True


def _kernel(rows: int) -> str:
    chosen = _chosen.get(rows)
    if chosen is None:
        chosen = _chosen[rows] = kernel_nearest(_by_rows, rows)
    return chosen


def _packs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if torch.compiler.is_compiling():  # `model.compile`: inductor picks the compiled graph's own kernels
        return False
    if not _enabled or x.dtype not in _DTYPES or weight.dtype != x.dtype or x.device.type != "cpu":
        return False
    if weight.dim() != 2 or (bias is not None and bias.dtype != x.dtype):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def _packed_copy(weight: torch.Tensor, kernel: str) -> torch.Tensor:
    """`weight` packed for `kernel` (ONEDNN, MKL or TRANSPOSED), made once and kept while the weight lives unchanged."""
    key = (kernel, weight.data_ptr(), tuple(weight.shape), weight.stride())
    version = 0 if weight.is_inference() else weight._version  # inference tensors change only in inference mode
    entry = _packed.get(key)
    if entry is not None and entry[0]() is not None and entry[1] == version:
        return entry[2]
    dense = weight.detach().contiguous()
    if kernel == MKL:  # the pack's row-count hint sizes nothing here: one copy serves every row count
        packed = torch.ops.mkl._mkl_reorder_linear_weight(dense, _ROWS_HINT)
    elif kernel == TRANSPOSED:
        packed = dense.t().contiguous()  # [K, N]
    else:
        packed = torch.ops.mkldnn._reorder_linear_weight(dense, _ROWS_HINT)

    def forget(ref: weakref.ref, key: tuple = key) -> None:
        if _packed.get(key, (None,))[0] is ref:  # not a newer weight's entry at the same address
            del _packed[key]

    # A slice taken at each call (a CMLM head's rows) dies with the call; the tensor it views does not.
    owner = weight if weight._base is None else weight._base
    _packed[key] = (weakref.ref(owner, forget), version, packed)
    return packed

"""What `model.dtype=auto` decodes in: bfloat16 on GPU; on CPU, bfloat16 where the CPU has bfloat16
matrix hardware and a decode step of this model measured faster in it, float32 elsewhere.

Torch-free, so that the driver resolves `auto` once per job: the first actor measures a decode step in
both dtypes as it starts (`Generator.ready`), the driver chooses from that, records the choice in the
job's identity, and hands it to every actor, restarted ones and a resumed job's included, so that no
job mixes dtypes.

Which CPU flags count: `amx_bf16` (AMX's bfloat16 tile matmuls) and `avx512_bf16` (AVX512-BF16's
bfloat16 dot products), the instructions oneDNN runs bfloat16 matmuls on. Without them oneDNN converts
bfloat16 to float32 for the arithmetic, and a step that reads half the bytes spends more than that
saving on conversions; with them, whether bfloat16 wins still depends on the model's size (a model held
in the CPU's caches is not bound by memory), hence the measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

BF16_MATRIX_FLAGS = ("amx_bf16", "avx512_bf16")
# bfloat16 only where its step takes at most this share of float32's: a model so small that the two are
# within timing noise of each other would otherwise decode in either from one job to the next.
BF16_WINS_BELOW = 0.9


def bf16_matrix_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The flags of `BF16_MATRIX_FLAGS` this CPU has, from its first processor's `flags` line (none
    where the file is not there: another OS)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            present = set(line.partition(":")[2].split())
            return [flag for flag in BF16_MATRIX_FLAGS if flag in present]
    return []


def choose_auto_dtype(on_gpu: bool, flags: Sequence[str], step_seconds: Mapping[str, float] | None) -> str:
    """`auto`'s dtype: bfloat16 on GPU; on CPU, bfloat16 only with bfloat16 matrix hardware (`flags`)
    and a decode step measured clearly faster in it (`BF16_WINS_BELOW`; `step_seconds`: seconds by dtype
    name; None: not measured)."""
    if on_gpu:
        return "bfloat16"
    if not flags or not step_seconds:
        return "float32"
    return "bfloat16" if step_seconds["bfloat16"] <= BF16_WINS_BELOW * step_seconds["float32"] else "float32"

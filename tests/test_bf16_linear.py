"""bfloat16 models on CPU run their matmuls through `linear`'s kernels, timed per row count as float32's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strategies.runtime import linear

needs_bf16 = pytest.mark.skipif(torch.bfloat16 not in linear._DTYPES, reason="oneDNN runs no bfloat16 on this CPU")


@pytest.fixture(autouse=True)
def _choice_put_back():
    before = linear.choice()
    yield
    linear.pack_by_rows(before)


@needs_bf16
def test_a_bfloat16_model_on_cpu_packs_and_mkl_stays_float32_only():
    assert linear.packs_on(torch.device("cpu"), torch.bfloat16)
    assert linear.MKL not in linear.kernels(torch.bfloat16)
    assert not linear.packs_on(torch.device("cpu"), torch.float16)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_every_bfloat16_kernel_computes_f_linear(rows):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=generator).to(torch.bfloat16)
    weight = torch.randn(96, 64, generator=generator).to(torch.bfloat16)
    expected = F.linear(x, weight).float()
    for kernel in (*linear.kernels(torch.bfloat16), linear.MKL):  # a float32 choice of MKL runs oneDNN here
        linear.pack_by_rows({1: kernel})
        got = linear.linear(x, weight).float()
        assert torch.allclose(got, expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item()), kernel

"""Dense matrix multiply probes: mm, addmm, bmm and baddbmm, any dtype.

A linear layer of a batch M, in-features K and out-features N costs one (M,K)x(K,N) product
forward and (M,N)x(N,K) plus (N,M)x(M,K) backward (`linear_layer_gemms` names them), so one
model over (variant, batch, M, N, K, dtype) costs every product a training step runs. Batched
products (`bmm`, `baddbmm`) are what horizontal fusion turns a stack of small GEMMs into.
"""
from __future__ import annotations

from typing import Callable

import torch

from probes.timing import time_callable
from probes.vocabulary.ops import GEMM_OP, PRODUCTS, gemm_params
from probes.vocabulary.records import Measurement

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _kernel(variant: str, m: int, n: int, k: int, batch: int, dtype: torch.dtype,
            device: torch.device) -> Callable[[], object]:
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    if variant == "mm":
        a, b, out = rand(m, k), rand(k, n), torch.empty(m, n, device=device, dtype=dtype)
        return lambda: torch.mm(a, b, out=out)
    if variant == "addmm":
        bias, a, b, out = rand(n), rand(m, k), rand(k, n), torch.empty(m, n, device=device, dtype=dtype)
        return lambda: torch.addmm(bias, a, b, out=out)
    a, b, out = rand(batch, m, k), rand(batch, k, n), torch.empty(batch, m, n, device=device, dtype=dtype)
    if variant == "bmm":
        return lambda: torch.bmm(a, b, out=out)
    acc = rand(batch, m, n)
    return lambda: torch.baddbmm(acc, a, b, out=out)


def measure_gemm(
    m: int, n: int, k: int, dtype: str = "float32", device: torch.device | str = "cpu", max_seconds: float = 1.0,
    variant: str = "mm", batch: int = 1, product: str | None = None,
) -> Measurement:
    """Time one product on fresh random operands. `product` (forward / grad_input /
    grad_weight) only labels which product of a linear layer the shape is."""
    device = torch.device(device)
    params = gemm_params(m, n, k, dtype, variant, batch)
    if product is not None:
        if product not in PRODUCTS:
            raise ValueError(f"unknown product {product!r}; expected one of {PRODUCTS}")
        params["product"] = product
    fn = _kernel(variant, m, n, k, batch, DTYPES[dtype], device)
    t = time_callable(fn, device=device, max_seconds=max_seconds)
    return Measurement(GEMM_OP, params, t.median_s, t.spread_s, t.repeats, device=str(device), family="gemm")

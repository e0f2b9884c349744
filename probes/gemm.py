"""Dense matrix multiply probes: mm, addmm, bmm and baddbmm, any dtype.

A linear layer of a batch M, in-features K and out-features N costs one (M,K)x(K,N) product
forward and (M,N)x(N,K) plus (N,M)x(M,K) backward (`linear_layer_gemms` names them), so one
model over (variant, batch, M, N, K, dtype) costs every product a training step runs. Batched
products (`bmm`, `baddbmm`) are what horizontal fusion turns a stack of small GEMMs into.
"""
from __future__ import annotations

from typing import Callable

import torch

from probes.records import Measurement
from probes.timing import time_callable

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GEMM_VARIANTS = ("mm", "addmm", "bmm", "baddbmm")
PRODUCTS = ("forward", "grad_input", "grad_weight")


def gemm_params(m: int, n: int, k: int, dtype: str = "float32", variant: str = "mm", batch: int = 1) -> dict:
    """Shape, flops and the bytes read and written once; `addmm` adds a bias row, `baddbmm`
    reads an (batch, M, N) input it accumulates into."""
    if variant not in GEMM_VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; expected one of {GEMM_VARIANTS}")
    if variant in ("mm", "addmm") and batch != 1:
        raise ValueError(f"{variant} has no batch dimension; got batch={batch}")
    size = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    elems = batch * (m * k + k * n + m * n)
    flops = 2.0 * batch * m * n * k
    if variant == "addmm":
        elems, flops = elems + n, flops + m * n
    elif variant == "baddbmm":
        elems, flops = elems + batch * m * n, flops + batch * m * n
    return {"M": int(m), "N": int(n), "K": int(k), "dtype": dtype, "variant": variant, "batch": int(batch),
            "flops": flops, "bytes": float(size * elems)}


def linear_layer_gemms(batch: int, in_features: int, out_features: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the forward and the two backward products of one linear layer, in the
    order of `PRODUCTS`."""
    return [
        (batch, out_features, in_features),  # y = x W^T
        (batch, in_features, out_features),  # dx = dy W
        (out_features, in_features, batch),  # dW = dy^T x
    ]


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
    return Measurement("gemm", params, t.median_s, t.spread_s, t.repeats, device=str(device), family="gemm")

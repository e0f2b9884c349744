"""Dense matrix multiply (GEMM) probes: the forward product and its two backward products.

A linear layer of a batch M, in-features K and out-features N costs one (M,K)x(K,N) product
forward and (M,N)x(N,K) plus (N,M)x(M,K) backward, so measuring plain `mm` over shapes covers
all three; the model is fitted on (M, N, K, dtype).
"""
from __future__ import annotations

import torch

from probes.records import Measurement
from probes.timing import time_callable

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def gemm_params(m: int, n: int, k: int, dtype: str = "float32") -> dict:
    size = torch.tensor([], dtype=_DTYPES[dtype]).element_size()
    return {
        "M": int(m),
        "N": int(n),
        "K": int(k),
        "dtype": dtype,
        "flops": 2.0 * m * n * k,
        "bytes": float(size * (m * k + k * n + m * n)),
    }


def linear_layer_gemms(batch: int, in_features: int, out_features: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the forward and the two backward products of one linear layer."""
    return [
        (batch, out_features, in_features),  # y = x W^T
        (batch, in_features, out_features),  # dx = dy W
        (out_features, in_features, batch),  # dW = dy^T x
    ]


def measure_gemm(
    m: int, n: int, k: int, dtype: str = "float32", device: torch.device | str = "cpu", max_seconds: float = 1.0
) -> Measurement:
    device = torch.device(device)
    torch_dtype = _DTYPES[dtype]
    a = torch.randn(m, k, device=device, dtype=torch_dtype)
    b = torch.randn(k, n, device=device, dtype=torch_dtype)
    out = torch.empty(m, n, device=device, dtype=torch_dtype)
    t = time_callable(lambda: torch.mm(a, b, out=out), device=device, max_seconds=max_seconds)
    return Measurement("gemm", gemm_params(m, n, k, dtype), t.median_s, t.spread_s, t.repeats, device=str(device), family="gemm")

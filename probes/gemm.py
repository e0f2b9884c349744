"""Dense matrix multiply probes: mm, addmm, bmm and baddbmm, any dtype.

A linear layer of a batch M, in-features K and out-features N costs one (M,K)x(K,N) product
forward and (M,N)x(N,K) plus (N,M)x(M,K) backward (`linear_layer_gemms` names them), so one
model over (variant, batch, M, N, K, dtype) costs every product a training step runs. Batched
products (`bmm`, `baddbmm`) are what horizontal fusion turns a stack of small GEMMs into.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from probes.probe import LocalProbe, ProbeSpec, log_uniform, timed_measurement
from probes.timing import time_callable
from probes.vocabulary.ops import GEMM_OP, PRODUCTS, gemm_params
from probes.vocabulary.records import Measurement

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _kernel(
    variant: str, m: int, n: int, k: int, batch: int, dtype: torch.dtype, device: torch.device
) -> Callable[[], object]:
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
    m: int,
    n: int,
    k: int,
    dtype: str = "float32",
    device: torch.device | str = "cpu",
    max_seconds: float = 1.0,
    variant: str = "mm",
    batch: int = 1,
    product: str | None = None,
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
    return timed_measurement(GEMM_OP, params, t, device, "gemm")


def _measure(p: dict[str, Any], device: str) -> list[Measurement]:
    return [
        measure_gemm(
            p["M"],
            p["N"],
            p["K"],
            p.get("dtype", "float32"),
            device=device,
            variant=p.get("variant", "mm"),
            batch=p.get("batch", 1),
            product=p.get("product"),
        )
    ]


PROBE = LocalProbe("gemm", _measure)


# Share of GEMM points per variant, and per dtype on each device kind. Reduced-precision
# products on a CPU without bf16/fp16 units are emulated (~50x below fp32): sampled more
# rarely and capped in flops so one point stays under a second.
_VARIANT_SHARE = {"mm": 0.55, "addmm": 0.15, "bmm": 0.15, "baddbmm": 0.15}
_DTYPE_SHARE = {"cpu": {"float32": 0.85, "bfloat16": 0.15}, "cuda": {"float32": 0.4, "bfloat16": 0.3, "float16": 0.3}}
_MAX_FLOPS = {
    "cpu": {"float32": 2.0 * 2048**3, "bfloat16": 2.0 * 256**3},
    "cuda": {"float32": 2.0 * 8192**3, "bfloat16": 2.0 * 8192**3, "float16": 2.0 * 8192**3},
}


def gemm_specs(n: int, seed: int, max_dim: int = 2048, device_kind: str = "cpu") -> list[ProbeSpec]:
    """M, N, K (and the batch of bmm/baddbmm) log-uniform; variant and dtype drawn by share;
    a shape over the dtype's flop cap is drawn again."""
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed)
    variants, v_p = zip(*_VARIANT_SHARE.items())
    dtypes, d_p = zip(*_DTYPE_SHARE[kind].items())
    out = []
    for i in range(n):
        variant = str(rng.choice(variants, p=v_p))
        dtype = str(rng.choice(dtypes, p=d_p))
        while True:
            m, nn, k = (log_uniform(rng, 8, max_dim) for _ in range(3))
            batch = log_uniform(rng, 2, 64) if variant in ("bmm", "baddbmm") else 1
            if 2.0 * batch * m * nn * k <= _MAX_FLOPS[kind][dtype]:
                break
        params = {"M": m, "N": nn, "K": k, "dtype": dtype, "variant": variant, "batch": batch}
        out.append(ProbeSpec("gemm", params, f"{variant}:{batch}x{m}x{nn}x{k}:{dtype}"))
    return out

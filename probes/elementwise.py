"""Element-wise and normalisation ops over (rows, cols) activations, forward and backward.

The backward kernels a training step runs (`gelu_bwd`, `layer_norm_bwd`, `softmax_bwd`) are
measured as the aten backward ops autograd calls, so a graph builder prices them instead of
guessing a multiple of the forward. (relu's and dropout's backward are a masked multiply.)

Element-wise ops stream memory, so a roofline (launch + bytes / bandwidth) describes them;
normalisation and softmax reduce along rows, so their cost also depends on the row length.
`bytes` counts what the op must read and write once, in the dtype's element size (float32,
bfloat16 or float16).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from probes.probe import LocalProbe, ProbeSpec, log_uniform, timed_measurement
from probes.timing import time_callable
from probes.vocabulary.ops import BACKWARD_OPS, ELEMENTWISE_OPS, elementwise_params
from probes.vocabulary.records import Measurement

# Activation dtypes probed: float32, and the reduced precisions mixed-precision training runs
# these ops in (every op above runs in all three on CPU too, torch 2.13).
DTYPES = ("float32", "bfloat16", "float16")


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown element-wise dtype {dtype!r}; expected one of {DTYPES}")
    return getattr(torch, dtype)


def _kernel(op: str, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> Callable[[], object]:
    cols = x.shape[-1]
    weight = torch.ones(cols, dtype=x.dtype, device=x.device)
    bias = torch.zeros(cols, dtype=x.dtype, device=x.device)
    if op in BACKWARD_OPS:
        return _backward_kernel(op, x, y, weight, bias)
    return {
        "relu": lambda: torch.clamp_min(x, 0.0, out=out),
        "gelu": lambda: F.gelu(x),
        "tanh": lambda: torch.tanh(x, out=out),
        "add": lambda: torch.add(x, y, out=out),
        "mul": lambda: torch.mul(x, y, out=out),
        "layer_norm": lambda: F.layer_norm(x, (cols,), weight, bias),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "dropout": lambda: F.dropout(x, p=0.1, training=True),
    }[op]


def _backward_kernel(
    op: str, x: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> Callable[[], object]:
    """The aten op autograd runs for `op`'s forward, with the tensors it saved."""
    aten = torch.ops.aten
    if op == "gelu_bwd":
        return lambda: aten.gelu_backward(grad, x)
    if op == "softmax_bwd":
        probs = torch.softmax(x, dim=-1)
        return lambda: aten._softmax_backward_data(grad, probs, -1, x.dtype)
    cols = x.shape[-1]
    _, mean, rstd = aten.native_layer_norm(x, [cols], weight, bias, 1e-5)
    return lambda: aten.native_layer_norm_backward(grad, x, [cols], mean, rstd, weight, bias, [True, True, True])


def measure_elementwise(
    op: str, rows: int, cols: int, device: torch.device | str = "cpu", dtype: str = "float32", max_seconds: float = 1.0
) -> Measurement:
    if op not in ELEMENTWISE_OPS:
        raise ValueError(f"unknown element-wise op {op!r}; expected one of {ELEMENTWISE_OPS}")
    device = torch.device(device)
    torch_dtype = _torch_dtype(dtype)
    x = torch.randn(rows, cols, device=device, dtype=torch_dtype)
    y = torch.randn(rows, cols, device=device, dtype=torch_dtype)
    out = torch.empty_like(x)
    t = time_callable(_kernel(op, x, y, out), device=device, max_seconds=max_seconds)
    return timed_measurement(op, elementwise_params(op, rows, cols, dtype), t, device, "elementwise")


def _measure(p: dict[str, Any], device: str) -> list[Measurement]:
    return [measure_elementwise(p["op"], p["rows"], p["cols"], device=device, dtype=p.get("dtype", "float32"))]


PROBE = LocalProbe("elementwise", _measure)


# Share of element-wise points per activation dtype on each device kind. Every op runs in
# bfloat16 and float16 on CPU too (torch 2.13; at 0.3-2x the float32 time, memory-bound either
# way), but CPUs train in bfloat16 if in reduced precision at all: float16 is sampled rarely.
_ELEMENTWISE_DTYPE_SHARE = {
    "cpu": {"float32": 0.7, "bfloat16": 0.2, "float16": 0.1},
    "cuda": {"float32": 0.4, "bfloat16": 0.4, "float16": 0.2},
}
# The first passes over the ops are float32, so a sweep cut short has every op's float32
# model (what it had before reduced precision was probed) instead of a few points per dtype.
_FLOAT32_PASSES = 3


def elementwise_specs(n: int, seed: int, max_numel: int = 4 * 2**20, device_kind: str = "cpu") -> list[ProbeSpec]:
    """Each element-wise / normalisation op over log-uniform (rows, cols), ops in turn; the
    dtype drawn by the device kind's share (its own random stream: the shapes are those the
    sweep always drew), after `_FLOAT32_PASSES` float32 passes over the ops."""
    kind = "cuda" if device_kind.startswith("cuda") else "cpu"
    rng = np.random.default_rng(seed + 3)
    dtype_rng = np.random.default_rng([seed, 3, 16])
    dtypes, d_p = zip(*_ELEMENTWISE_DTYPE_SHARE[kind].items())
    out = []
    for i in range(n):
        op = ELEMENTWISE_OPS[i % len(ELEMENTWISE_OPS)]
        cols = log_uniform(rng, 16, 4096)
        rows = max(1, min(log_uniform(rng, 1, 8192), max_numel // cols))
        dtype = str(dtype_rng.choice(dtypes, p=d_p))
        if i < _FLOAT32_PASSES * len(ELEMENTWISE_OPS):
            dtype = "float32"
        out.append(
            ProbeSpec(
                "elementwise", {"op": op, "rows": rows, "cols": cols, "dtype": dtype}, f"{op}:{rows}x{cols}:{dtype}"
            )
        )
    return out

"""Element-wise and normalisation ops over (rows, cols) activations, forward.

Element-wise ops stream memory, so a roofline (launch + bytes / bandwidth) describes them;
normalisation and softmax reduce along rows, so their cost also depends on the row length.
`bytes` counts what the op must read and write once.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from probes.records import Measurement
from probes.timing import time_callable

UNARY = ("relu", "gelu", "tanh")
BINARY = ("add", "mul")
ROW_OPS = ("layer_norm", "softmax", "dropout")
ELEMENTWISE_OPS = UNARY + BINARY + ROW_OPS


def elementwise_params(op: str, rows: int, cols: int, dtype: str = "float32") -> dict:
    numel = rows * cols
    size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    tensors = 3 if op in BINARY else 2  # inputs read + output written
    return {"op": op, "rows": int(rows), "cols": int(cols), "numel": int(numel), "dtype": dtype,
            "bytes": float(tensors * numel * size)}


def _kernel(op: str, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> Callable[[], object]:
    cols = x.shape[-1]
    weight = torch.ones(cols, dtype=x.dtype, device=x.device)
    bias = torch.zeros(cols, dtype=x.dtype, device=x.device)
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


def measure_elementwise(op: str, rows: int, cols: int, device: torch.device | str = "cpu", dtype: str = "float32",
                        max_seconds: float = 1.0) -> Measurement:
    if op not in ELEMENTWISE_OPS:
        raise ValueError(f"unknown element-wise op {op!r}; expected one of {ELEMENTWISE_OPS}")
    device = torch.device(device)
    torch_dtype = getattr(torch, dtype)
    x = torch.randn(rows, cols, device=device, dtype=torch_dtype)
    y = torch.randn(rows, cols, device=device, dtype=torch_dtype)
    out = torch.empty_like(x)
    t = time_callable(_kernel(op, x, y, out), device=device, max_seconds=max_seconds)
    return Measurement(op, elementwise_params(op, rows, cols, dtype), t.median_s, t.spread_s, t.repeats,
                       device=str(device), family="elementwise")

"""Op names, and the parameter functions that describe one kernel to its model.

A probe measures an op at some parameters; a graph builder asks the model of the same op for
the same parameters. Both sides call the functions here, so the features a model is fitted on
are exactly the features it is asked about, and an op's name is spelled in one place. Nothing
here needs torch: element sizes are the dtypes' widths in bytes.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# Element sizes of the floating dtypes the probes and the jobs run, in bytes.
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Kernels, each measured by its own probe.
GEMM_OP = "gemm"
EMBEDDING_FWD_OP = "embedding_fwd"
EMBEDDING_BWD_OP = "embedding_bwd"
MEMCPY_OP = "memcpy"
UNARY_OPS = ("relu", "gelu", "tanh")
BINARY_OPS = ("add", "mul")
ROW_OPS = ("layer_norm", "softmax", "dropout")
BACKWARD_OPS = ("gelu_bwd", "layer_norm_bwd", "softmax_bwd")
ELEMENTWISE_OPS = UNARY_OPS + BINARY_OPS + ROW_OPS + BACKWARD_OPS
COLLECTIVE_OPS = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")

# Rows of a training step or a pair of kernels, from which corrections and costs are fitted.
IN_CONTEXT_OP = "in_context"  # one kernel's time inside a captured training step
IN_STEP_COLLECTIVE_OP = "in_step_collective"  # collectives inside captured training steps (their metrics)
CPU_OVERHEAD_OP = "cpu_overhead"  # host dispatch time per op, from a captured step
PAIR_OP = "overlap_pair"  # an unfused or overlapped compute + collective pair
TRANSFER_OP = "overlap_transfer"  # the overlapped form's communication alone, k slices
SYMM_MEM_OP = "overlap_symm_mem"  # PyTorch's symmetric-memory fused kernels for a pair (CUDA)
FUSION_OP = "fused_training"  # an HFTA-fused training step of `width` repetitive jobs
DLRM_STEP_OP = "dlrm_step"  # a whole DLRM training step, measured
TRANSFORMER_STEP_OP = "transformer_step"  # a whole transformer training step, measured
# Per-step framework overhead of a workload: what its measured steps leave over the simulated
# kernels (fitted from the step rows' residuals; the residual rows carry these ops).
DLRM_OVERHEAD_OP = "dlrm_overhead"
TRANSFORMER_OVERHEAD_OP = "transformer_overhead"
STEP_OVERHEAD_OPS = {"dlrm": DLRM_OVERHEAD_OP, "transformer": TRANSFORMER_OVERHEAD_OP}
# The name prefix of the calibration's small random DLRMs (`probes.training.overhead_job`):
# measured for the framework's per-op overheads, far below the jobs plans are made for.
FRAMEWORK_JOB_PREFIX = "overhead"
# The name prefix of the calibration's production-shaped DLRM probes (`probes.training`): jobs
# drawn by the random-task generator at full size, the shape of the jobs plans are made for.
TASK_JOB_PREFIX = "task"

GEMM_VARIANTS = ("mm", "addmm", "bmm", "baddbmm")
PRODUCTS = ("forward", "grad_input", "grad_weight")
MEMCPY_DIRECTIONS = ("d2d", "h2d", "d2h")


def element_bytes(dtype: str) -> int:
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"dtype: expected one of {list(ELEMENT_BYTES)}, got {dtype!r}")
    return ELEMENT_BYTES[dtype]


def gemm_params(m: int, n: int, k: int, dtype: str = "float32", variant: str = "mm", batch: int = 1) -> dict:
    """Shape, flops and the bytes read and written once; `addmm` adds a bias row, `baddbmm`
    reads an (batch, M, N) input it accumulates into."""
    if variant not in GEMM_VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; expected one of {GEMM_VARIANTS}")
    if variant in ("mm", "addmm") and batch != 1:
        raise ValueError(f"{variant} has no batch dimension; got batch={batch}")
    size = element_bytes(dtype)
    elems = batch * (m * k + k * n + m * n)
    flops = 2.0 * batch * m * n * k
    if variant == "addmm":
        elems, flops = elems + n, flops + m * n
    elif variant == "baddbmm":
        elems, flops = elems + batch * m * n, flops + batch * m * n
    return {
        "M": int(m),
        "N": int(n),
        "K": int(k),
        "dtype": dtype,
        "variant": variant,
        "batch": int(batch),
        "flops": flops,
        "bytes": float(size * elems),
    }


def linear_layer_gemms(batch: int, in_features: int, out_features: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the forward and the two backward products of one linear layer, in the
    order of `PRODUCTS`."""
    return [
        (batch, out_features, in_features),  # y = x W^T
        (batch, in_features, out_features),  # dx = dy W
        (out_features, in_features, batch),  # dW = dy^T x
    ]


def elementwise_params(op: str, rows: int, cols: int, dtype: str = "float32") -> dict:
    """Shape, dtype and the bytes the op moves (in `dtype`'s element size): the models are
    fitted per dtype."""
    numel = rows * cols
    size = element_bytes(dtype)
    # inputs read + outputs written (backward: grad_out and the saved tensor in, grad_in out)
    tensors = 3 if op in BINARY_OPS or op in BACKWARD_OPS else 2
    return {
        "op": op,
        "rows": int(rows),
        "cols": int(cols),
        "numel": int(numel),
        "dtype": dtype,
        "bytes": float(tensors * numel * size),
    }


def memcpy_directions(device_kind: str) -> tuple[str, ...]:
    """Copies a device kind has: host copies to and from a GPU, and device-to-device."""
    return MEMCPY_DIRECTIONS if device_kind.startswith("cuda") else ("d2d",)


def memcpy_params(direction: str, nbytes: int) -> dict:
    return {"direction": direction, "bytes": float(nbytes)}


def collective_params(op: str, nbytes: int, world: int, scope: str = "intra", uneven: bool = False) -> dict:
    params: dict[str, Any] = {"op": op, "bytes": int(nbytes), "world": int(world), "scope": scope}
    if uneven:
        params["uneven"] = True
    return params


def bus_bandwidth(op: str, nbytes: float, seconds: float, world: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s, as nccl-tests counts them."""
    alg = nbytes / seconds if seconds > 0 else 0.0
    if op == "all_reduce":
        return alg, alg * 2 * (world - 1) / world
    if op == "broadcast":
        return alg, alg
    return alg, alg * (world - 1) / world


def uneven_splits(numel: int, n: int, seed: int, skew: float = 0.6) -> np.ndarray:
    """S[i, j]: elements rank i sends to rank j; log-normal skew around numel / n per pair,
    the same on every rank for a given seed (as a skewed embedding all-to-all is)."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, skew, size=(n, n))
    return np.maximum(1, np.round(weights / weights.mean() * numel / n)).astype(np.int64)


def gemm_params_from_shapes(name: str, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int, str, int] | None:
    """(M, N, K, variant, batch) of a traced matrix product from its recorded input shapes."""
    try:
        if name == "aten::linear" and len(shapes[0]) == 2 and len(shapes[1]) == 2:
            (m, k), (n, _) = shapes[0], shapes[1]
            return m, n, k, ("addmm" if len(shapes) > 2 and shapes[2] else "mm"), 1
        if name in ("aten::mm", "aten::addmm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::addmm" else (shapes[0], shapes[1])
            return a[0], b[1], a[1], name.split("::")[1], 1
        if name in ("aten::bmm", "aten::baddbmm"):
            a, b = (shapes[1], shapes[2]) if name == "aten::baddbmm" else (shapes[0], shapes[1])
            return a[1], b[2], a[2], name.split("::")[1], a[0]
    except (IndexError, TypeError, ValueError):
        return None
    return None


def framework_job(job: dict[str, Any]) -> bool:
    """Whether a measured step's job (its `params["job"]`) is one of the calibration's small
    random DLRMs for the framework's overheads (`FRAMEWORK_JOB_PREFIX`), not a job of the space
    plans are made for."""
    return str(job.get("name", "")).startswith(FRAMEWORK_JOB_PREFIX)


def task_job(job: dict[str, Any]) -> bool:
    """Whether a measured step's job (its `params["job"]`) is one of the calibration's
    production-shaped DLRM probes (`TASK_JOB_PREFIX`), not a light or framework one."""
    return str(job.get("name", "")).startswith(TASK_JOB_PREFIX)

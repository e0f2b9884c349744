"""Kernel times inside real training steps, for the in-context correction of isolated probes.

A microbenchmark repeats one kernel on the same inputs, so its caches, allocator and branch
predictors are warm; inside a training step the same kernel reads what the previous op wrote
and writes fresh activations that autograd keeps alive. On the 2-core development VM the
fitted in-step / isolated ratios are gelu 2.5x, layer_norm 1.85x, GEMMs 1.39x, softmax 1.19x
(benchmarks/results/calibration_heldout_cpu2c-n1-bc3cb441b9.json). These rows pair each top-level op of a captured step
(`probes/trace_capture.py`) with the model op and params the isolated probes use, so the
predictor can learn, per op, how much slower the step really runs it. On CUDA the in-step
duration is the op's kernel time (`device_s` of the capture), never its host dispatch span.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from probes.vocabulary.ops import (
    EMBEDDING_BWD_OP,
    EMBEDDING_FWD_OP,
    IN_CONTEXT_OP,
    elementwise_params,
    gemm_params,
    gemm_params_from_shapes,
)
from probes.vocabulary.records import Measurement

# Top-level aten ops whose first input's (rows, last dim) is the probed element-wise shape.
ELEMENTWISE_ATEN = {
    "aten::relu": "relu",
    "aten::gelu": "gelu",
    "aten::tanh": "tanh",
    "aten::add": "add",
    "aten::mul": "mul",
    "aten::layer_norm": "layer_norm",
    "aten::softmax": "softmax",
    "aten::_softmax": "softmax",
    "aten::dropout": "dropout",
    "aten::gelu_backward": "gelu_bwd",
    "aten::native_layer_norm_backward": "layer_norm_bwd",
    "aten::_softmax_backward_data": "softmax_bwd",
}


def model_op_for(name: str, shapes: Sequence[Sequence[int]]) -> tuple[str, dict[str, Any]] | None:
    """The isolated-probe op and params that price this traced op, or None if none does."""
    gemm = gemm_params_from_shapes(name, shapes)
    if gemm is not None:
        m, n, k, variant, batch = gemm
        if min(m, n, k, batch) < 1:
            return None
        return "gemm", gemm_params(m, n, k, variant=variant, batch=batch)
    op = ELEMENTWISE_ATEN.get(name)
    if op is None or not shapes or not shapes[0]:
        return None
    first = [int(d) for d in shapes[0]]
    if op in ("add", "mul") and (len(shapes) < 2 or list(shapes[1]) != first):
        return None  # scalar or broadcast forms are not what the probe measured
    cols = first[-1]
    rows = math.prod(first[:-1]) if len(first) > 1 else 1
    if rows < 1 or cols < 1:
        return None
    return op, elementwise_params(op, rows, cols)


def op_duration_s(op: dict[str, Any]) -> float | None:
    """A captured op's duration: its kernels' summed device time when the capture recorded
    device work (`device_s`, CUDA), else its host span (CPU, where the kernel runs inline).
    None for an op of a device capture that launched no kernel (nothing to compare)."""
    if "device_s" in op:
        return float(op["device_s"]) if op.get("kernels", 1) else None
    return float(op["end_s"] - op["start_s"])


def in_context_rows(steps: Sequence[dict[str, Any]], device: str, world_size: int, workload: str) -> list[Measurement]:
    """One row per priced top-level op of every captured step (duration in context: device
    time on CUDA, see `op_duration_s`)."""
    rows = []
    for step in steps:
        for op in step["ops"]:
            priced = model_op_for(op["name"], op.get("shapes", []))
            duration = op_duration_s(op)
            if priced is None or duration is None:
                continue
            model_op, params = priced
            rows.append(_in_context_row(model_op, op["name"], workload, params, duration, device, world_size))
    return rows


def _in_context_row(
    model_op: str, aten_op: str, workload: str, params: dict[str, Any], seconds: float, device: str, world_size: int
) -> Measurement:
    """One traced op's time in a step of `workload`, priced by `model_op` at `params`."""
    return Measurement(
        IN_CONTEXT_OP,
        {"model_op": model_op, "aten_op": aten_op, "workload": workload, **params},
        seconds,
        0.0,
        1,
        device=device,
        world_size=world_size,
        family="training",
    )


# A table-batched lookup as a trace shows it: FBGEMM's forward (its indices' bounds checked
# first, both inside the module's forward the isolated probe times) and its backward with the
# fused optimizer, whatever the optimizer (`..._sgd_...`, `..._rowwise_adagrad_...`).
TBE_BOUNDS_CHECK = "fbgemm::bounds_check_indices"
TBE_LOOKUP_PREFIX = "fbgemm::split_embedding_codegen_lookup_"
TBE_BACKWARD_PREFIX = "fbgemm::split_embedding_backward_codegen_"


def tbe_in_context_rows(
    steps: Sequence[dict[str, Any]], features: dict[str, Any], device: str, world_size: int, workload: str
) -> list[Measurement]:
    """The lookup's forward and backward inside each captured step, priced at `features` (the
    rank's one lookup as the graph prices it, `ShardedDLRM.lookup_features`): what the isolated
    TBE probe leaves out of a step (the rows the previous step's update and the exchange left
    in cache, the other rank's lookups beside it). A step whose trace does not show exactly one
    lookup and one backward gives no rows: which op is which would be a guess.

    Why: traced inside the steps of #26, the TBE backward ran 0.94-1.50x its model
    (`benchmarks/step_breakdown.py`, its 11-29 05:05 and 15:33 results), and without these
    rows only the step overhead's per-class slowdowns and constant, fitted on 24 steps, could
    take that up. On the 12-01 20:28 calibration (an Intel host) they did so anyway: the
    paired refit with and without these rows priced its run's jobs alike
    (`benchmarks/refit_e2e.py --without-tbe-in-step`)."""
    rows = []
    for step in steps:
        ops = step["ops"]
        lookups = [op for op in ops if op["name"].startswith(TBE_LOOKUP_PREFIX)]
        backwards = [op for op in ops if op["name"].startswith(TBE_BACKWARD_PREFIX)]
        checks = [op for op in ops if op["name"] == TBE_BOUNDS_CHECK]
        if len(lookups) != 1 or len(backwards) != 1 or len(checks) > 1:
            continue
        forward = [op_duration_s(op) for op in lookups + checks]
        backward = op_duration_s(backwards[0])
        if backward is None or None in forward:
            continue
        forward_s = sum(d for d in forward if d is not None)
        rows.append(
            _in_context_row(EMBEDDING_FWD_OP, lookups[0]["name"], workload, features, forward_s, device, world_size)
        )
        rows.append(
            _in_context_row(EMBEDDING_BWD_OP, backwards[0]["name"], workload, features, backward, device, world_size)
        )
    return rows


# A collective work item's kind from its traced name: gloo's work items (`gloo:all_reduce`)
# and NCCL's kernels (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`; an all-to-all runs as
# grouped send/receive) alike.
COLLECTIVE_KINDS = {
    "all_reduce": ("allreduce", "all_reduce"),
    "all_to_all": ("alltoall", "all_to_all", "sendrecv"),
    "all_gather": ("allgather", "all_gather"),
    "reduce_scatter": ("reducescatter", "reduce_scatter"),
    "broadcast": ("broadcast",),
}


def collective_kind(name: str) -> str | None:
    lowered = name.lower()
    for kind, marks in COLLECTIVE_KINDS.items():
        if any(m in lowered for m in marks):
            return kind
    return None


def step_collectives(steps: Sequence[dict[str, Any]]) -> list[list[list[Any]]]:
    """Per captured step, this rank's collective work items in start order: [kind, seconds]
    (from when the backend began the item to its completion: queueing behind earlier items
    excluded, waiting for late ranks included)."""
    return [
        [[collective_kind(c["name"]) or c["name"], float(c["end_s"] - c["start_s"])] for c in step["comm"]]
        for step in steps
    ]


def in_step_collectives(per_rank: Sequence[list[list[list[Any]]]]) -> list[list[list[Any]]]:
    """Per captured step, each collective's in-step time: the least over ranks of its work
    item's time (the last rank to arrive waits for no one, so its time is the collective's
    own). A step whose ranks saw different sequences of collectives is left out."""
    out = []
    for step in zip(*per_rank):
        kinds = [[kind for kind, _ in items] for items in step]
        if any(k != kinds[0] for k in kinds):
            continue
        out.append([[kind, min(items[j][1] for items in step)] for j, kind in enumerate(kinds[0])])
    return out

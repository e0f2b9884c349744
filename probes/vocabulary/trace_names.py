"""The names torch.profiler gives what the trace readers look for, in one place: read from live
profiler events (`probes/overhead_trace.py`, `probes/trace_capture.py`) and from exported
Kineto JSON (`predictors/kineto_trace.py`), which must agree on what a dispatcher op, a
collective work item and the backward engine are. Torch-free."""

from __future__ import annotations

import re

DISPATCHER_OP_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?$")  # one namespace: a dispatcher op
NOT_OP_NAMESPACES = ("autograd::",)  # autograd::engine::... never matches, but be explicit
HOST_COLLECTIVE_PREFIXES = ("gloo:", "nccl:")  # the backend's work items on its own threads
DEVICE_COLLECTIVE_PREFIXES = ("ncclDevKernel", "ncclKernel")  # NCCL's kernels on a GPU
BACKWARD_ENGINE_PREFIX = "autograd::engine::evaluate_function"  # the range around each backward node


def work_item_in_step(start: float, end: float, lo: float, hi: float) -> tuple[float, float] | None:
    """A collective work item's (start, end) inside the step [lo, hi], or None when it is not
    that step's. It is the step's when it starts inside it, its end cut at the step's: gloo
    completes a work's future before it closes the work's profiler range, so on a busy host the
    range can close after the step that waited on it has ended (seen: 0.4 ms past a 0.7 ms step)."""
    return (start, min(end, hi)) if lo <= start <= hi else None


def is_dispatcher_op_name(name: str) -> bool:
    """Whether `name` is a dispatcher op's (`namespace::op[.overload]`, not autograd's)."""
    return bool(DISPATCHER_OP_NAME.match(name)) and not name.startswith(NOT_OP_NAMESPACES)

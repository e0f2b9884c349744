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


def is_dispatcher_op_name(name: str) -> bool:
    """Whether `name` is a dispatcher op's (`namespace::op[.overload]`, not autograd's)."""
    return bool(DISPATCHER_OP_NAME.match(name)) and not name.startswith(NOT_OP_NAMESPACES)

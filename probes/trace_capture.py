"""Capture what one training step really ran, as plain JSON, for the trace importer
(`predictors/trace_graph.py`).

A few steps run under `torch.profiler` with shapes recorded; for the last one we keep, on the
calling thread, every top-level dispatcher op (name, start, end, input shapes) and, from the
collective backend's own threads, every collective work item (`gloo:all_reduce`, ...; NCCL
kernels on a GPU) with its start and end. Times are seconds from the step's start; each step
also keeps its start on the host's monotonic clock (`start_clock_s`, shared by every process of
a host), so the importer can restore how far apart the ranks of one host really started. Every
rank of a process group must call `capture_step_trace` together (the steps hold collectives).
"""
from __future__ import annotations

import socket
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from probes.overheads import STEP_MARK, is_dispatcher_op, _has_op_ancestor

COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "ncclDevKernel", "ncclKernel")


def _is_collective_work(e: Any) -> bool:
    return e.name.startswith(COLLECTIVE_PREFIXES)


def capture_step_trace(step: Callable[[], object], iterations: int = 5, warmup: int = 2,
                       barrier: Callable[[], None] | None = None) -> dict[str, Any]:
    """Profile `iterations` steps after `warmup`; return them as a JSON-able trace:
    `{"unprofiled_step_s", "host", "steps": [{"step_s", "start_clock_s", "ops", "comm"}, ...]}`
    (step order).

    `barrier` (e.g. `torch.distributed.barrier`) runs before every step so ranks start
    together, as the launcher's timed steps do; the unprofiled step times are kept beside the
    trace so the profiler's own inflation is visible.
    """
    sync = barrier or (lambda: None)
    for _ in range(warmup):
        sync()
        step()
    plain = []
    for _ in range(iterations):
        sync()
        t0 = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t0)
    starts = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(iterations):
            sync()
            starts.append(time.monotonic())
            with record_function(STEP_MARK):
                step()
    events = prof.events()
    windows = sorted((e for e in events if e.name == STEP_MARK), key=lambda e: e.time_range.start)
    if not windows:
        raise RuntimeError("the profiler recorded no step")
    if len(windows) != len(starts):
        raise RuntimeError(f"the profiler recorded {len(windows)} steps of {len(starts)}")
    return {"unprofiled_step_s": float(np.median(plain)), "host": socket.gethostname(),
            "steps": [{**_one_step(events, w), "start_clock_s": t} for w, t in zip(windows, starts)]}


def _one_step(events: Any, window: Any) -> dict[str, Any]:
    lo, hi = float(window.time_range.start), float(window.time_range.end)
    main = window.thread

    def inside(e: Any) -> bool:
        return lo <= e.time_range.start and e.time_range.end <= hi + 1.0

    ops, comm = [], []
    for e in events:
        if not inside(e) or e.name == STEP_MARK:
            continue
        if _is_collective_work(e):
            comm.append({"name": e.name, "start_s": (e.time_range.start - lo) * 1e-6,
                         "end_s": (e.time_range.end - lo) * 1e-6, "thread": int(e.thread)})
        elif e.thread == main and is_dispatcher_op(e) and not _has_op_ancestor(e):
            ops.append({"name": e.name, "start_s": (e.time_range.start - lo) * 1e-6,
                        "end_s": (e.time_range.end - lo) * 1e-6,
                        "shapes": [list(s) if isinstance(s, (list, tuple)) else [] for s in (e.input_shapes or [])]})
    ops.sort(key=lambda o: o["start_s"])
    comm.sort(key=lambda o: o["start_s"])
    return {"step_s": (hi - lo) * 1e-6, "ops": ops, "comm": comm}

"""Capture what one training step really ran, as plain JSON, for the trace importer
(`predictors/trace_graph.py`).

A few steps run under `torch.profiler` with shapes recorded; for the last one we keep, on the
calling thread, every top-level dispatcher op (name, start, end, input shapes) and, from the
collective backend's own threads, every collective work item (`gloo:all_reduce`, ...; NCCL
kernels on a GPU) with its start and end. Times are seconds from the step's start; each step
also keeps its start on the host's monotonic clock (`start_clock_s`, shared by every process of
a host), so the importer can restore how far apart the ranks of one host really started. Every
rank of a process group must call `capture_step_trace` together (the steps hold collectives).

On CUDA the host times of an op are its dispatch (the kernels run later, asynchronously), so
the profile also records CUDA activity and every top-level op is given its device work: the
kernels (and memcpy / memset) it launched, found through the profiler's correlation ids (each
device event's `linked_correlation_id`, or on PyTorch 2.11 its own id, is the id of the
innermost CPU event that launched it, the runtime's launch call; its outermost enclosing
dispatcher op is the top-level op). Such an op keeps its host `start_s` /
`end_s` (its place in the issue order) and adds `device_s` (the summed kernel time: its
duration on the device), `device_start_s` / `device_end_s` (first kernel start, last kernel end,
same clock as `start_s`) and `kernels` (how many). Backward ops, which run on the autograd
engine's device thread there, are kept beside the calling thread's ops. Collective work items
are then the NCCL kernels (on the device's timeline, `thread` = their stream), not the host's
`nccl:` ranges. Steps on CPU are captured exactly as before (no device keys).
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from probes.overhead_trace import STEP_MARK, has_op_ancestor, is_dispatcher_op
from probes.vocabulary.trace_names import (
    BACKWARD_ENGINE_PREFIX,
    DEVICE_COLLECTIVE_PREFIXES,
    HOST_COLLECTIVE_PREFIXES,
    work_item_in_step,
)

COLLECTIVE_PREFIXES = HOST_COLLECTIVE_PREFIXES + DEVICE_COLLECTIVE_PREFIXES


def _is_collective_work(e: Any) -> bool:
    return e.name.startswith(COLLECTIVE_PREFIXES)


def _on_device(e: Any) -> bool:
    return e.device_type != DeviceType.CPU


def _is_device_work(d: Any) -> bool:
    """A kernel, memcpy or memset on the device (not the GPU-side copy of a `record_function`
    range, which spans the kernels inside it)."""
    return (
        _on_device(d)
        and not getattr(d, "is_user_annotation", False)
        and "annotation" not in str(getattr(d, "activity_type", "") or "")
    )


def _top_level_op(e: Any) -> Any | None:
    """The outermost dispatcher op among `e` and its CPU ancestors (None if there is none)."""
    top = None
    while e is not None:
        if is_dispatcher_op(e):
            top = e
        e = e.cpu_parent
    return top


def _correlation(d: Any) -> int:
    """The correlation id a device event shares with the CPU event that launched it: its
    `linked_correlation_id` where the profiler sets one, else (PyTorch 2.11's FunctionEvents
    have none) its own id, which is the launching runtime call's (cudaLaunchKernel's) id."""
    return int(getattr(d, "linked_correlation_id", 0) or d.id)


def _launchers(events: Iterable[Any]) -> dict[int, Any]:
    """Correlation id → the CPU op that launched device work under it (frontend ops only)."""
    return {
        e.id: e for e in events if not _on_device(e) and not e.is_async and getattr(e, "linked_correlation_id", 0) == 0
    }


def device_time_by_op(events: Iterable[Any]) -> dict[int, dict[str, float]]:
    """Each top-level op's device work, keyed by `id(op)`: `{"device_us", "start_us", "end_us",
    "kernels"}` (summed kernel / memcpy / memset time, first start, last end, count; profiler
    microseconds). A device event belongs to the op whose correlation id it links to, and from
    there to that op's outermost dispatcher-op ancestor. Collective kernels are left out (they
    are the communication, timed as work items, not the launching op's compute); device events
    whose launcher is unknown or outside any dispatcher op are left out."""
    events = list(events)
    launchers = _launchers(events)
    out: dict[int, dict[str, float]] = {}
    for d in events:
        if not _is_device_work(d) or d.name.startswith(DEVICE_COLLECTIVE_PREFIXES):
            continue
        launcher = launchers.get(_correlation(d))
        top = _top_level_op(launcher) if launcher is not None else None
        if top is None:
            continue
        lo, hi = float(d.time_range.start), float(d.time_range.end)
        acc = out.setdefault(id(top), {"device_us": 0.0, "start_us": lo, "end_us": hi, "kernels": 0})
        acc["device_us"] += hi - lo
        acc["start_us"], acc["end_us"] = min(acc["start_us"], lo), max(acc["end_us"], hi)
        acc["kernels"] += 1
    return out


def device_collectives(events: Iterable[Any]) -> list[tuple[Any, float]]:
    """The NCCL kernels, each with the host start of the op that launched it (its own start if
    the launcher is unknown): a kernel belongs to the step its launch was issued in."""
    events = list(events)
    launchers = _launchers(events)
    out = []
    for d in events:
        if _is_device_work(d) and d.name.startswith(DEVICE_COLLECTIVE_PREFIXES):
            launcher = launchers.get(_correlation(d))
            out.append((d, float((launcher or d).time_range.start)))
    return out


def _in_backward_engine(e: Any) -> bool:
    parent = e.cpu_parent
    while parent is not None:
        if parent.name.startswith(BACKWARD_ENGINE_PREFIX):
            return True
        parent = parent.cpu_parent
    return False


def capture_step_trace(
    step: Callable[[], object],
    iterations: int = 5,
    warmup: int = 2,
    barrier: Callable[[], None] | None = None,
    cuda: bool | None = None,
) -> dict[str, Any]:
    """Profile `iterations` steps after `warmup`; return them as a JSON-able trace:
    `{"unprofiled_step_s", "host", "steps": [{"step_s", "start_clock_s", "ops", "comm"}, ...]}`
    (step order).

    `barrier` (e.g. `torch.distributed.barrier`) runs before every step so ranks start
    together, as the launcher's timed steps do; the unprofiled step times are kept beside the
    trace so the profiler's own inflation is visible.

    `cuda`: also record CUDA activity and give ops their device time (module docstring);
    by default when this process has initialised CUDA. A step whose ops launched no device
    work is written as on CPU.
    """
    if cuda is None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
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
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(iterations):
            sync()
            starts.append(time.monotonic())
            with record_function(STEP_MARK):
                step()
        if cuda:
            torch.cuda.synchronize()  # the last step's kernels inside the profile
    events = prof.events()
    windows = sorted((e for e in events if e.name == STEP_MARK and not _on_device(e)), key=lambda e: e.time_range.start)
    if not windows:
        raise RuntimeError("the profiler recorded no step")
    if len(windows) != len(starts):
        raise RuntimeError(f"the profiler recorded {len(windows)} steps of {len(starts)}")
    device = (device_time_by_op(events), device_collectives(events)) if cuda else None
    return {
        "unprofiled_step_s": float(np.median(plain)),
        "host": socket.gethostname(),
        "steps": [{**_one_step(events, w, device), "start_clock_s": t} for w, t in zip(windows, starts)],
    }


def _one_step(events: Any, window: Any, device: tuple[dict, list] | None = None) -> dict[str, Any]:
    """One step's ops and collective work items; `device`: (`device_time_by_op`,
    `device_collectives`) of the whole profile, when CUDA activity was recorded."""
    lo, hi = float(window.time_range.start), float(window.time_range.end)
    main = window.thread
    per_op, nccl = device if device is not None else ({}, [])

    def inside(e: Any) -> bool:
        return lo <= e.time_range.start and e.time_range.end <= hi + 1.0

    ops, comm = [], []
    timed = False  # some op of this step ran device work
    for e in events:
        if _on_device(e) or e.name == STEP_MARK:
            continue
        if _is_collective_work(e):
            span = work_item_in_step(float(e.time_range.start), float(e.time_range.end), lo, hi)
            if span is not None:
                comm.append(
                    {
                        "name": e.name,
                        "start_s": (span[0] - lo) * 1e-6,
                        "end_s": (span[1] - lo) * 1e-6,
                        "thread": int(e.thread),
                    }
                )
        elif inside(e) and (
            (e.thread == main or (device is not None and _in_backward_engine(e)))
            and is_dispatcher_op(e)
            and not has_op_ancestor(e)
        ):
            op = {
                "name": e.name,
                "start_s": (e.time_range.start - lo) * 1e-6,
                "end_s": (e.time_range.end - lo) * 1e-6,
                "shapes": [list(s) if isinstance(s, (list, tuple)) else [] for s in (e.input_shapes or [])],
            }
            if device is not None:
                op["_main"] = e.thread == main
                span = per_op.get(id(e))
                if span is not None:
                    timed = True
                    op.update(
                        device_s=span["device_us"] * 1e-6,
                        device_start_s=(span["start_us"] - lo) * 1e-6,
                        device_end_s=(span["end_us"] - lo) * 1e-6,
                        kernels=int(span["kernels"]),
                    )
                else:
                    op.update(device_s=0.0, kernels=0)
            ops.append(op)
    kernels = [(d, t) for d, t in nccl if lo <= t <= hi + 1.0]
    if device is not None:
        if not timed and not kernels:  # nothing ran on the device: the CPU capture, as it was
            ops = [o for o in ops if o["_main"]]
            for o in ops:
                for key in ("device_s", "kernels"):
                    o.pop(key)
        for o in ops:
            o.pop("_main")
    if kernels:  # the NCCL kernels are the work items; the host's `nccl:` ranges only bracket them
        comm = [c for c in comm if not c["name"].startswith("nccl:")]
        comm += [
            {
                "name": d.name,
                "start_s": (d.time_range.start - lo) * 1e-6,
                "end_s": (d.time_range.end - lo) * 1e-6,
                "thread": int(getattr(d, "device_resource_id", d.thread)),
            }
            for d, _ in kernels
        ]
    ops.sort(key=lambda o: o["start_s"])
    comm.sort(key=lambda o: o["start_s"])
    out = {"step_s": (hi - lo) * 1e-6, "ops": ops, "comm": comm}
    if timed or kernels:
        out["device"] = "cuda"
    return out

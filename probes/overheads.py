"""Per-op CPU-side overheads of real training steps, read from `torch.profiler` events.

Why: kernel models say how long an op's *work* takes; an iteration also pays the host's time
around and between that work (Python, the dispatcher, the autograd engine, kernel launches).
On a GPU that host time decides whether kernels queue back to back or starve; on a CPU it is
simply added. A simulator needs it per op and as a distribution, not as one fitted constant,
so this probe profiles a few real steps and keeps every sample.

What is measured, per *top-level op*: the outermost dispatcher op (`namespace::name`, e.g.
`aten::linear`, `fbgemm::...`, `c10d::allreduce_`) on its thread, i.e. one that no other
dispatcher op encloses. Annotations (`record_function` ranges, `ProfilerStep#`, DDP's
`DistributedDataParallel.forward`) and autograd-engine ranges (`autograd::engine::evaluate_function:
X`) are transparent, so backward ops count as top-level too. Non-`aten` dispatcher ops are
included on purpose: leaving `fbgemm::` or `c10d::` ops out would count their whole running
time as a "gap" before the next aten op.

- `dispatch`: a top-level op's self CPU time, outside its child ops (and outside any kernel
  launch it issued): the dispatcher / wrapper / argument-checking work around the real kernel.
  An op without children is skipped: its whole time is the kernel, which kernel models own.
  On CPU a kernel runs inline, inside the op's *own* time when the op has a CPU kernel of its
  own (`aten::mm`'s children are only `resolve_conj`, its self time is the GEMM). So on CPU only
  ops with no CPU kernel registered (composite and view ops such as `aten::linear`, `aten::t`,
  `aten::reshape`, autograd wrappers such as FBGEMM's lookup function) give dispatch samples:
  their self time can only be framework work. On CUDA every op with children or launches does.
- `gap`: from the end of one top-level op to the start of the next on the same thread, inside
  one step: Python, autograd-engine bookkeeping, optimizer loops. Attributed to the *next* op.
  A gap inside which recorded work on another thread finished (a gloo collective, the CUDA
  autograd thread's backward) is dropped: there the thread was waiting, not doing overhead.
- `launch`: CUDA only, the duration of each `cudaLaunchKernel`-like runtime call, attributed to
  the top-level op enclosing it in time.

Caveat: the profiler's own per-range instrumentation (one to a few microseconds per recorded
range on a small CPU) is inside these numbers, so they are upper bounds. Every row carries the
profiled and the unprofiled step time (`step_s`, `unprofiled_step_s`) and the implied cost per
recorded range (`profiler_s_per_event`), so a consumer can see or subtract the inflation.
"""
from __future__ import annotations

import bisect
import itertools
import os
import re
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

from probes.vocabulary.records import Measurement

OP = "cpu_overhead"
FAMILY = "training"
KINDS = ("dispatch", "gap", "launch")
POOLED = "*"  # the aten_op of the row that pools every op of one kind
STEP_MARK = "overhead_probe_step"  # record_function around each analysed step

_USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: record_function annotations
_OP_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?$")  # one namespace: a dispatcher op
_NOT_OP_NAMESPACES = ("autograd::",)  # autograd::engine::... never matches, but be explicit
_LAUNCH_NAME = re.compile(r"^(cuda|cu|hip|hipExtModule)Launch(Cooperative)?Kernel")


@dataclass(frozen=True)
class OverheadSample:
    kind: str  # one of KINDS
    aten_op: str
    seconds: float


@dataclass
class OverheadTrace:
    """Everything extracted from one profile: the samples and what they were drawn from."""

    samples: list[OverheadSample] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # each analysed step's wall time (profiled)
    top_level_ops: int = 0
    events_per_step: float = 0.0  # recorded CPU ranges per analysed step (the profiler's cost driver)
    dropped_gaps: int = 0  # gaps in which another thread's work finished (waits, not overhead)


def _start(e: Any) -> float:
    return float(e.time_range.start)


def _end(e: Any) -> float:
    return float(e.time_range.end)


def is_dispatcher_op(e: Any) -> bool:
    """A synchronous CPU event named `namespace::op` that is not an annotation."""
    return (
        not e.is_async
        and e.device_type == DeviceType.CPU
        and e.scope != _USER_SCOPE
        and not e.is_user_annotation
        and bool(_OP_NAME.match(e.name))
        and not e.name.startswith(_NOT_OP_NAMESPACES)
    )


@lru_cache(maxsize=None)
def has_backend_kernel(name: str, overload: str = "", dispatch_key: str = "CPU") -> bool:
    """Whether the op (overload) registers its own kernel for `dispatch_key`, i.e. whether its
    self time on that backend may contain real compute. Unknown ops count as having one."""
    qualified = f"{name}.{overload}" if overload else name
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(qualified, dispatch_key))
    except RuntimeError:
        return True


def _separable_self_time(e: Any, cuda: bool) -> bool:
    """Whether a top-level op's self CPU time is framework overhead rather than kernel work."""
    return cuda or not has_backend_kernel(e.name, getattr(e, "overload_name", "") or "", "CPU")


def _has_op_ancestor(e: Any) -> bool:
    parent = e.cpu_parent
    while parent is not None:
        if is_dispatcher_op(parent):
            return True
        parent = parent.cpu_parent
    return False


def _descendant_ids(e: Any) -> set[int]:
    out: set[int] = set()
    stack = list(e.cpu_children)
    while stack:
        child = stack.pop()
        out.add(id(child))
        stack.extend(child.cpu_children)
    return out


def _ends_inside(ends: list[float], lo: float, hi: float) -> bool:
    """Whether any value of the sorted `ends` lies in the open range (lo, hi)."""
    i = bisect.bisect_right(ends, lo)
    return i < len(ends) and ends[i] < hi


def extract_overheads(events: Sequence[Any], step_mark: str = STEP_MARK, cuda: bool = False) -> OverheadTrace:
    """Samples of every overhead kind from profiler `events` (FunctionEvents, µs clocks).

    `cuda`: the step ran its kernels on a GPU, so an op's own CPU time is never kernel work.

    Only events inside a `record_function(step_mark)` range are analysed, so harness code
    between steps never becomes a gap.
    """
    windows = sorted((_start(e), _end(e)) for e in events if e.name == step_mark)
    out = OverheadTrace(step_s=[(b - a) * 1e-6 for a, b in windows])
    if not windows:
        return out
    win_starts = [w[0] for w in windows]

    def window_of(e: Any) -> int | None:
        i = bisect.bisect_right(win_starts, _start(e)) - 1
        return i if i >= 0 and _end(e) <= windows[i][1] else None

    out.events_per_step = sum(
        1 for e in events if e.name != step_mark and not e.is_async and window_of(e) is not None
    ) / len(windows)

    # Top-level ops per (window, thread), in start order; on one thread they never overlap.
    top: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for e in events:
        if is_dispatcher_op(e) and not _has_op_ancestor(e):
            w = window_of(e)
            if w is not None:
                top[(w, e.thread)].append(e)
    for ops in top.values():
        ops.sort(key=_start)
    out.top_level_ops = sum(len(v) for v in top.values())
    threads_of: dict[int, list[int]] = defaultdict(list)
    for w, thread in top:
        threads_of[w].append(thread)
    top_starts = {key: [_start(op) for op in ops] for key, ops in top.items()}

    def enclosing(w: int, thread: int, e: Any) -> Any | None:
        ops = top[(w, thread)]
        i = bisect.bisect_right(top_starts[(w, thread)], _start(e)) - 1
        return ops[i] if i >= 0 and _end(e) <= _end(ops[i]) else None

    # Kernel launches (CUDA), attributed by time to the top-level op enclosing them,
    # preferring one on the launching thread.
    launches_of: dict[int, list[Any]] = defaultdict(list)
    for e in events:
        if not _LAUNCH_NAME.match(e.name):
            continue
        w = window_of(e)
        if w is None:
            continue
        owners = [op for t in threads_of[w] if (op := enclosing(w, t, e)) is not None]
        if owners:
            owner = max(owners, key=lambda op: (op.thread == e.thread, _start(op)))
            launches_of[id(owner)].append(e)
            out.samples.append(OverheadSample("launch", owner.name, (_end(e) - _start(e)) * 1e-6))

    # When recorded work on another thread (a gloo collective, the CUDA autograd thread's ops)
    # *finishes* inside a gap, the thread was most likely blocked on it: such a gap is a wait.
    # Only host-side work counts: device kernels finish asynchronously all the time.
    ends_by_thread: dict[int, list[float]] = defaultdict(list)
    for (_, thread), ops in top.items():
        ends_by_thread[thread].extend(_end(op) for op in ops)
    for e in events:
        if e.is_async and e.device_type == DeviceType.CPU and window_of(e) is not None:
            ends_by_thread[e.thread].append(_end(e))  # e.g. a gloo collective's work item

    for (_, thread), ops in sorted(top.items(), key=lambda kv: kv[0]):
        foreign_ends = sorted(x for t, xs in ends_by_thread.items() if t != thread for x in xs)
        for prev, op in zip([None, *ops[:-1]], ops):
            own_launches = launches_of.get(id(op), [])
            if (op.cpu_children or own_launches) and _separable_self_time(op, cuda):
                inside = _descendant_ids(op)
                extra_launch_us = sum(_end(l) - _start(l) for l in own_launches if id(l) not in inside)
                self_us = float(op.self_cpu_time_total) - extra_launch_us
                if self_us > 0:
                    out.samples.append(OverheadSample("dispatch", op.name, self_us * 1e-6))
            if prev is None:
                continue
            lo, hi = _end(prev), _start(op)
            if hi <= lo:
                continue
            if _ends_inside(foreign_ends, lo, hi):
                out.dropped_gaps += 1
                continue
            out.samples.append(OverheadSample("gap", op.name, (hi - lo) * 1e-6))
    return out


def _stats(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    p10, p25, p50, p75, p90 = np.percentile(v, [10, 25, 50, 75, 90])
    return {"p10": float(p10), "p25": float(p25), "p50": float(p50), "p75": float(p75), "p90": float(p90),
            "mean": float(v.mean()), "max": float(v.max()), "count": int(v.size)}


def summarise(
    trace: OverheadTrace, workload: str, device: str = "cpu", world_size: int = 1,
    extra: dict[str, Any] | None = None,
) -> list[Measurement]:
    """One Measurement per (kind, op) plus one pooled (`aten_op="*"`) row per kind."""
    by_key: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in trace.samples:
        by_key[(s.kind, s.aten_op)].append(s.seconds)
        by_key[(s.kind, POOLED)].append(s.seconds)
    common = dict(extra or {})
    if trace.step_s:
        common.update(step_s=float(np.median(trace.step_s)), step_max_s=float(max(trace.step_s)))
    rows = []
    for (kind, name), values in sorted(by_key.items()):
        st = _stats(values)
        row_extra = {k: st[k] for k in ("p10", "p90", "mean", "max", "count")} | common
        if kind == "gap" and name == POOLED:
            row_extra["dropped_gaps"] = trace.dropped_gaps
        rows.append(Measurement(
            OP, {"kind": kind, "aten_op": name, "workload": workload}, st["p50"], st["p75"] - st["p25"],
            st["count"], device=device, world_size=world_size, family=FAMILY, extra=row_extra,
        ))
    return rows


def _overload_names_config() -> Any:
    """Ask the profiler for overload names (to tell `aten::sum` from `aten::sum.dim_IntList`,
    which have different kernels); None where this experimental option is missing."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(capture_overload_names=True)
    except (ImportError, TypeError):
        return None


def _write_execution_trace(step: Callable[[], object], sync: Callable[[], None], trace_path: str) -> None:
    """One step under the execution-trace observer (kept apart from the profiled steps, whose
    timings its per-op recording would inflate)."""
    Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
    observer = ExecutionTraceObserver().register_callback(str(trace_path))
    if not observer.is_registered:
        raise RuntimeError(f"could not register the execution trace observer for {trace_path}")
    try:
        observer.start()
        step()
        sync()
    finally:
        observer.stop()
        observer.unregister_callback()


def profile_overheads(
    step: Callable[[], object],
    iterations: int = 5,
    warmup: int = 3,
    device: str = "cpu",
    trace_path: str | None = None,
    workload: str = "dlrm",
) -> list[Measurement]:
    """Overhead distributions of `step` as Measurements (see the module docstring).

    Calls `step`: `warmup` times; `iterations` times unprofiled (timed, `unprofiled_step_s`);
    once more (under the execution-trace observer when `trace_path` is given); once under the
    profiler unanalysed (its start-up cost lands there); then `iterations` analysed times.
    That is `warmup + 2 * iterations + 2` calls whatever `trace_path` is, so ranks of a process
    group that step together stay in lock step even if only one of them writes a trace.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    plain: list[float] = []  # the same steps unprofiled, to show the profiler's inflation
    for _ in range(iterations):
        t0 = time.perf_counter()
        step()
        sync()
        plain.append(time.perf_counter() - t0)
    if trace_path is not None:
        _write_execution_trace(step, sync, trace_path)
    else:
        step()
        sync()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, experimental_config=_overload_names_config()) as prof:
        step()
        sync()
        for _ in range(iterations):
            with record_function(STEP_MARK):
                step()
            sync()
    trace = extract_overheads(prof.events(), cuda=cuda)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    extra: dict[str, Any] = {"iterations": iterations, "top_level_ops": trace.top_level_ops}
    extra["unprofiled_step_s"] = float(np.median(plain))
    if trace.step_s and trace.events_per_step:
        # What recording one range costs, from the profiled vs plain step: the inflation that
        # every sample above carries (a few ranges' worth per gap or dispatch sample).
        inflation = max(float(np.median(trace.step_s)) - extra["unprofiled_step_s"], 0.0)
        extra["profiler_s_per_event"] = inflation / trace.events_per_step
    return summarise(trace, workload, str(dev), world, extra)


# --- the DLRM step -------------------------------------------------------------------------


def cycling_step(model: Any) -> Callable[[], float]:
    """A zero-argument training step of a `ShardedDLRM` that cycles through its batches."""
    batches = itertools.cycle(model.batches)
    return lambda: model.step(next(batches))


def dlrm_overhead_step(
    job_dict: dict[str, Any], device: str = "cpu", table_to_rank: Sequence[int] | None = None
) -> Callable[[], float]:
    """A real DLRM training step (TBEs, all-to-all, DDP MLPs, SGD) on the *current* process
    group, ready for `profile_overheads`.

    The group must already be initialised (a gang's, or `local_process_group()` for one
    process); every rank must then call the step the same number of times. `table_to_rank`
    defaults to round-robin over the group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("dlrm_overhead_step needs an initialised process group; "
                           "wrap it in probes.overheads.local_process_group() for a single process")
    from probes.vocabulary.jobspec import JobSpec
    from probes.workloads.dlrm import ShardedDLRM

    job = JobSpec.from_dict(job_dict)
    rank, world = dist.get_rank(), dist.get_world_size()
    placement = list(table_to_rank) if table_to_rank is not None else [i % world for i in range(len(job.tables))]
    return cycling_step(ShardedDLRM(job, placement, rank, world, torch.device(device)))


@contextmanager
def local_process_group(backend: str = "gloo") -> Iterator[bool]:
    """A world-of-one process group (FileStore in a temp dir) if none is initialised yet.

    Yields whether it created the group; only a group it created is destroyed on exit.
    """
    if dist.is_initialized():
        yield False
        return
    with tempfile.TemporaryDirectory(prefix="overheads-pg-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield True
        finally:
            dist.destroy_process_group()


def profile_dlrm_overheads(
    job_dict: dict[str, Any], device: str = "cpu", iterations: int = 5, warmup: int = 3,
    trace_path: str | None = None, table_to_rank: Sequence[int] | None = None,
) -> list[Measurement]:
    """Overheads of the DLRM step in this process alone (a world of one unless a group exists)."""
    with local_process_group("nccl" if torch.device(device).type == "cuda" else "gloo"):
        step = dlrm_overhead_step(job_dict, device, table_to_rank)
        return profile_overheads(step, iterations, warmup, device, trace_path, workload="dlrm")

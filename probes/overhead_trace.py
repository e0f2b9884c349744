"""Per-op CPU-side overhead samples read from `torch.profiler` events (the parsing behind
`probes.overheads`, whose probe profiles real training steps).

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
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import torch
from torch.autograd import DeviceType

from probes.vocabulary.trace_names import is_dispatcher_op_name

KINDS = ("dispatch", "gap", "launch")
STEP_MARK = "overhead_probe_step"  # record_function around each analysed step

_USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: record_function annotations
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
        and is_dispatcher_op_name(e.name)
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


def has_op_ancestor(e: Any) -> bool:
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
        if is_dispatcher_op(e) and not has_op_ancestor(e):
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
                extra_launch_us = sum(_end(k) - _start(k) for k in own_launches if id(k) not in inside)
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

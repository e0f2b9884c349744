"""Per-op CPU-side overheads of real training steps: a few steps profiled under
`torch.profiler`, their samples (`probes.overhead_trace`, which says what each kind measures)
summarised as quantile rows.

Why: kernel models say how long an op's *work* takes; an iteration also pays the host's time
around and between that work (Python, the dispatcher, the autograd engine, kernel launches).
On a GPU that host time decides whether kernels queue back to back or starve; on a CPU it is
simply added. A simulator needs it per op and as a distribution, not as one fitted constant,
so this probe profiles a few real steps and keeps every sample.

Caveat: the profiler's own per-range instrumentation (one to a few microseconds per recorded
range on a small CPU) is inside these numbers, so they are upper bounds. Every row carries the
profiled and the unprofiled step time (`step_s`, `unprofiled_step_s`) and the implied cost per
recorded range (`profiler_s_per_event`), so a consumer can see or subtract the inflation.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

from probes.overhead_trace import STEP_MARK, OverheadTrace, extract_overheads
from probes.vocabulary.records import Measurement

OP = "cpu_overhead"
FAMILY = "training"
POOLED = "*"  # the aten_op of the row that pools every op of one kind


def _stats(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    p10, p25, p50, p75, p90 = np.percentile(v, [10, 25, 50, 75, 90])
    return {
        "p10": float(p10),
        "p25": float(p25),
        "p50": float(p50),
        "p75": float(p75),
        "p90": float(p90),
        "mean": float(v.mean()),
        "max": float(v.max()),
        "count": int(v.size),
    }


def summarise(
    trace: OverheadTrace, workload: str, device: str = "cpu", world_size: int = 1, extra: dict[str, Any] | None = None
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
        rows.append(
            Measurement(
                OP,
                {"kind": kind, "aten_op": name, "workload": workload},
                st["p50"],
                st["p75"] - st["p25"],
                st["count"],
                device=device,
                world_size=world_size,
                family=FAMILY,
                extra=row_extra,
            )
        )
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

"""Traces users already have: per-rank Kineto traces exported by torch.profiler
(`prof.export_chrome_trace(path)`, or `tensorboard_trace_handler`'s `*.pt.trace.json[.gz]`),
from any model, read into the step records `predictors.trace_graph` imports (the format
`probes/trace_capture.py` writes), then priced with this hardware's models.

A step is a `ProfilerStep#N` range (what `prof.step()` marks); its thread is the training
thread. Per step: every top-level dispatcher op (`namespace::op` with no dispatcher op around
it) of that thread, or of the autograd engine's threads inside an `autograd::engine::
evaluate_function` range (the backward on CUDA), with its input shapes (`record_shapes=True`
is needed to price anything); every collective work item of the backend (`gloo:` / `nccl:`
ranges on its threads, or the NCCL kernels on a GPU); and on a GPU each op's kernels, found
through the runtime launch's correlation id (summed kernel time `device_s`, first start and
last end). A rank's trace names its rank (`distributedInfo`), host and clock base, so ranks of
one host keep their measured start offsets.

`price_graph` replaces the duration of every op this hardware's bundle models (GEMMs and
element-wise ops by their shapes, `probes.vocabulary.in_context.model_op_for`; collectives by
their launching c10d op's message) with its prediction, corrected to in-step time where the
bundle learnt that; everything else keeps its traced time, and the report says how much of
the step that is.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from predictors.graph import ExecutionGraph, GraphOp
from predictors.simulator import simulate
from predictors.trace_graph import RESUME, STEP_END, graph_from_traces, measured_iteration_s
from probes.vocabulary.in_context import collective_kind, model_op_for
from probes.vocabulary.ops import collective_params
from probes.vocabulary.trace_names import (
    BACKWARD_ENGINE_PREFIX,
    DEVICE_COLLECTIVE_PREFIXES,
    HOST_COLLECTIVE_PREFIXES,
    is_dispatcher_op_name,
    work_item_in_step,
)

STEP_PREFIX = "ProfilerStep#"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
TRACE_GLOBS = ("*.json", "*.json.gz")
MARKS = (STEP_END, RESUME)  # the importer's own ops (trace_graph), not traced work
ELEMENT_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8, "int": 4}


class TraceError(ValueError):
    """A trace this importer cannot read as training steps (names the file and what is missing)."""


@dataclass
class KinetoTrace:
    """One rank's exported trace, reduced to what the importer uses."""

    path: str
    rank: int
    world_size: int
    host: str
    base_s: float  # the clock the events' `ts` count from (seconds)
    events: list[dict[str, Any]] = field(repr=False)


def load_trace(path: str | Path) -> KinetoTrace:
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: not a readable Kineto JSON trace ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents (export it with torch.profiler's export_chrome_trace)")
    info = data.get("distributedInfo") or {}
    return KinetoTrace(
        str(path),
        int(info.get("rank", 0)),
        int(info.get("world_size", 1)),
        str(data.get("host_name", "")),
        float(data.get("baseTimeNanoseconds", 0)) * 1e-9,
        [e for e in data["traceEvents"] if e.get("ph") == "X" and "ts" in e and "dur" in e],
    )


def load_traces(directory: str | Path) -> list[KinetoTrace]:
    """Every rank's trace in `directory`, in rank order (one file per rank)."""
    directory = Path(directory)
    files = sorted({p for pattern in TRACE_GLOBS for p in directory.glob(pattern)})
    if not files:
        raise TraceError(f"{directory}: no Kineto traces (*.json or *.json.gz, one per rank)")
    traces = sorted((load_trace(p) for p in files), key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    if ranks != list(range(len(traces))) or any(t.world_size not in (1, len(traces)) for t in traces):
        raise TraceError(
            f"{directory}: expected one trace per rank 0..{len(traces) - 1} of one job, found ranks {ranks} "
            f"(world sizes {sorted({t.world_size for t in traces})})"
        )
    return traces


def step_windows(trace: KinetoTrace) -> list[dict[str, Any]]:
    """The trace's `ProfilerStep#N` ranges, in order: {step, tid, lo, hi} (us)."""
    marks = [e for e in trace.events if str(e.get("name", "")).startswith(STEP_PREFIX)]
    marks.sort(key=lambda e: e["ts"])
    return [
        {"step": int(e["name"][len(STEP_PREFIX) :] or 0), "tid": e["tid"], "lo": e["ts"], "hi": e["ts"] + e["dur"]}
        for e in marks
    ]


def _inside(e: dict[str, Any], lo: float, hi: float) -> bool:
    return lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1.0


def _encloses(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def _top_level(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ops of one thread with no other op of it around them (sorted by start)."""
    out: list[dict[str, Any]] = []
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        if out and _encloses(out[-1], e):
            continue
        out.append(e)
    return out


def _device_spans(trace: KinetoTrace, tops: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per top-level op (its index in `tops`): the device work its launches ran (us)."""
    launches = {
        e["args"]["correlation"]: e
        for e in trace.events
        if e.get("cat") in RUNTIME_CATEGORIES and "correlation" in e.get("args", {})
    }
    by_tid: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for i, op in enumerate(tops):
        by_tid.setdefault(op["tid"], []).append((i, op))
    spans: dict[int, dict[str, float]] = {}
    for k in trace.events:
        if k.get("cat") not in DEVICE_CATEGORIES or str(k.get("name", "")).startswith(DEVICE_COLLECTIVE_PREFIXES):
            continue
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is None:
            continue
        owner = next((i for i, op in by_tid.get(launch["tid"], []) if _encloses(op, launch)), None)
        if owner is None:
            continue
        span = spans.setdefault(owner, {"device_us": 0.0, "start_us": math.inf, "end_us": -math.inf, "kernels": 0})
        span["device_us"] += k["dur"]
        span["start_us"] = min(span["start_us"], k["ts"])
        span["end_us"] = max(span["end_us"], k["ts"] + k["dur"])
        span["kernels"] += 1
    return spans


def step_record(trace: KinetoTrace, window: dict[str, Any]) -> dict[str, Any]:
    """One step of one rank in `predictors.trace_graph`'s format (times in seconds from the
    step's start), with `start_clock_s` on the trace's clock and the launching c10d ops'
    message sizes kept (`bytes`) for pricing."""
    lo, hi, main = window["lo"], window["hi"], window["tid"]
    inside = [e for e in trace.events if _inside(e, lo, hi)]
    backward = [e for e in inside if str(e.get("name", "")).startswith(BACKWARD_ENGINE_PREFIX) and e["tid"] != main]

    def is_op(e: dict[str, Any]) -> bool:
        return e.get("cat") == "cpu_op" and is_dispatcher_op_name(str(e.get("name", "")))

    ops = [e for e in inside if is_op(e) and (e["tid"] == main or any(_encloses(b, e) for b in backward))]
    tops = [t for tid in {e["tid"] for e in ops} for t in _top_level([e for e in ops if e["tid"] == tid])]
    tops.sort(key=lambda e: e["ts"])
    spans = _device_spans(trace, tops)
    nccl = [
        e for e in inside if e.get("cat") == "kernel" and str(e.get("name", "")).startswith(DEVICE_COLLECTIVE_PREFIXES)
    ]
    host_comm = [
        {**e, "dur": span[1] - span[0]}
        for e in trace.events
        if str(e.get("name", "")).startswith(HOST_COLLECTIVE_PREFIXES) and e["tid"] != main
        for span in [work_item_in_step(e["ts"], e["ts"] + e["dur"], lo, hi)]
        if span is not None
    ]
    comm_events = nccl or host_comm
    out_ops = []
    device = bool(spans or nccl)
    for i, e in enumerate(tops):
        args = e.get("args", {})
        op: dict[str, Any] = {
            "name": e["name"],
            "start_s": (e["ts"] - lo) * 1e-6,
            "end_s": (e["ts"] + e["dur"] - lo) * 1e-6,
            "shapes": _shapes(args.get("Input Dims")),
        }
        if e["name"].startswith("c10d::"):
            op["bytes"] = _message_bytes(args)
        if device:
            span = spans.get(i)
            op.update(device_s=span["device_us"] * 1e-6 if span else 0.0, kernels=int(span["kernels"]) if span else 0)
            if span:
                op.update(device_start_s=(span["start_us"] - lo) * 1e-6, device_end_s=(span["end_us"] - lo) * 1e-6)
        out_ops.append(op)
    comm = [
        {
            "name": e["name"],
            "start_s": (e["ts"] - lo) * 1e-6,
            "end_s": (e["ts"] + e["dur"] - lo) * 1e-6,
            "thread": e["tid"] if not isinstance(e["tid"], str) else hash(e["tid"]),
        }
        for e in sorted(comm_events, key=lambda e: e["ts"])
    ]
    record = {"step_s": (hi - lo) * 1e-6, "ops": out_ops, "comm": comm, "start_clock_s": trace.base_s + lo * 1e-6}
    if device:
        record["device"] = "cuda"
    return record


def _shapes(dims: Any) -> list[list[int]]:
    """`Input Dims` as lists of ints per input (a tensor list's first tensor; scalars [])."""
    out = []
    for d in dims or []:
        if isinstance(d, list) and d and isinstance(d[0], list):
            d = d[0]
        out.append([int(x) for x in d] if isinstance(d, list) and all(isinstance(x, int) for x in d) else [])
    return out


def _message_bytes(args: dict[str, Any]) -> int | None:
    """A c10d op's message: its first input (a tensor or a list of them), in bytes."""
    dims = args.get("Input Dims") or []
    first = dims[0] if dims else None
    if isinstance(first, list) and first and isinstance(first[0], list):
        numel = sum(math.prod(t) for t in first if isinstance(t, list))
    elif isinstance(first, list):
        numel = math.prod(first)
    else:
        return None
    types = args.get("Input type") or []
    size = ELEMENT_BYTES.get(types[0], 4) if types else 4
    return int(numel * size) if numel else None


def common_steps(traces: Sequence[KinetoTrace]) -> list[int]:
    """The step numbers every rank's trace holds."""
    numbers = [{w["step"] for w in step_windows(t)} for t in traces]
    return sorted(set.intersection(*numbers)) if numbers else []


def steps_for(traces: Sequence[KinetoTrace], step: int) -> list[dict[str, Any]]:
    """Step `step` of every rank, rank order."""
    out = []
    for t in traces:
        window = next((w for w in step_windows(t) if w["step"] == step), None)
        if window is None:
            raise TraceError(f"{t.path}: no {STEP_PREFIX}{step}")
        out.append(step_record(t, window))
    return out


@dataclass
class PricedGraph:
    """The traced graph with every op this hardware models priced by it."""

    graph: ExecutionGraph
    priced_traced_s: float  # the priced ops' traced time (rank 0)
    traced_s: float  # every op's traced time (rank 0)
    unpriced: dict[str, float]  # op name -> traced seconds left as traced (rank 0)
    model_ops: list[str]  # the model op pricing each of rank 0's ops ("" where none)

    @property
    def priced_share(self) -> float:
        return self.priced_traced_s / self.traced_s if self.traced_s > 0 else 0.0


def _priced(op: GraphOp, ops: Sequence[GraphOp], model: Any, world: int) -> tuple[str, float | None]:
    """(the model op, its predicted isolated seconds), or ("", None) where nothing prices it.
    A collective is priced from its launching c10d op's message (the trace's ranks are one
    group, within one node: a trace does not say which nodes its ranks ran on)."""
    if op.kind == "collective":
        kind = collective_kind(op.name)
        launcher = ops[op.deps[0]] if op.deps else None
        nbytes = launcher.params.get("bytes") if launcher is not None else None
        if kind and nbytes and world > 1 and kind in model.models:
            return kind, model.predict_params(kind, collective_params(kind, int(nbytes), world))
        return "", None
    mapped = model_op_for(op.name, op.params.get("shapes") or [])
    if mapped is not None and mapped[0] in model.models:
        return mapped[0], model.predict_params(*mapped)
    return "", None


def price_graph(graph: ExecutionGraph, model: Any) -> PricedGraph:
    """`graph` (from `trace_graph.graph_from_traces` of `step_record`s) with modelled ops'
    durations replaced by `model`'s predictions (a `PerformanceModel`; in-step corrected)."""
    context = getattr(model, "in_step", None)
    world = graph.world_size
    priced_s = traced_s = 0.0
    unpriced: dict[str, float] = {}
    model_ops: list[str] = []
    ranks = []
    for r, ops in enumerate(graph.ranks):
        new_ops: list[GraphOp] = []
        for op in ops:
            seconds = op.duration_s or 0.0
            model_op, price = _priced(op, ops, model, world)
            if price is not None and context is not None:
                price = context.in_step(model_op, price)
            if r == 0:
                model_ops.append(model_op)
            if r == 0 and op.name not in MARKS:
                traced_s += seconds
                if price is not None:
                    priced_s += seconds
                else:
                    unpriced[op.name] = unpriced.get(op.name, 0.0) + seconds
            new_ops.append(replace(op, duration_s=price) if price is not None else op)
        ranks.append(new_ops)
    return PricedGraph(
        ExecutionGraph(ranks, meta={**graph.meta, "priced": True}), priced_s, traced_s, unpriced, model_ops
    )


@dataclass
class TracePrediction:
    """One traced step: as traced, replayed from its own op times (how well the graph holds
    it), and predicted with the bundle's models (`priced`: what they covered)."""

    traced_s: float
    rebuilt_s: float
    predicted_s: float
    priced: PricedGraph
    graph: ExecutionGraph  # as traced (every op its traced duration)


def predict_step(steps: Sequence[dict[str, Any]], hosts: Sequence[str], model: Any) -> TracePrediction:
    """Step records of every rank (`steps_for`) rebuilt as a graph and replayed, then priced by
    `model` and replayed again (imported ops carry their own durations and blocking)."""
    graph = graph_from_traces(steps, hosts)
    priced = price_graph(graph, model)

    def replay(g: ExecutionGraph) -> float:
        return simulate(g, lambda op: 0.0, synchronous=model.synchronous, share_links=False).iteration_s

    return TracePrediction(measured_iteration_s(steps, hosts), replay(graph), replay(priced.graph), priced, graph)

"""Import captured step traces (`probes/trace_capture.py`, one per rank) as an
`ExecutionGraph`, so the simulator can be checked on what really ran.

Per rank, every top-level op of the step's thread becomes a blocking op with its measured
duration, and the CPU time before it (the gap after the previous op) its measured issue time.
Each collective work item of the backend's threads becomes a non-blocking collective on the
communication stream of its thread (gloo runs collectives on several threads at once), right after the op that launched it (the latest `c10d::` op started
before it), over all ranks. Its duration is the shortest of the ranks' measured durations:
the last rank to arrive waits for nobody, so its time is the transfer alone, and the
simulator must reconstruct everyone else's waiting. An op that the thread started only after
a collective finished inside the gap before it (it was blocked in `wait`) waits for that
collective, then for the measured wake-up (an op of its own, so the simulator cannot hide it
behind the waiting). The step's end is an empty last op, so a measured tail counts; ranks of
one host start at their measured offsets (the host's monotonic clock).

`gemm_params_from_shapes` prices matrix products of an imported trace with the GEMM model, so
per-op predictions can be compared with what ran (`compare_gemms`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Sequence

from predictors.graph import ExecutionGraph, GraphOp
from probes.vocabulary.ops import gemm_params_from_shapes

LAUNCH_PREFIX = "c10d::"
RESUME = "resume_after_wait"
STEP_END = "step_end"


def _collective_durations(traces: Sequence[dict[str, Any]]) -> list[float]:
    counts = {len(t["comm"]) for t in traces}
    if len(counts) != 1:
        raise ValueError(f"ranks recorded different numbers of collectives: {[len(t['comm']) for t in traces]}")
    return [min(t["comm"][k]["end_s"] - t["comm"][k]["start_s"] for t in traces) for k in range(counts.pop())]


def _comm_channels(comm: Sequence[dict[str, Any]]) -> dict[Any, str]:
    """Each backend worker thread is a channel: gloo runs collectives on a few threads at once."""
    threads = sorted({item.get("thread", 0) for item in comm})
    return {t: "comm" if i == 0 else f"comm:{i}" for i, t in enumerate(threads)}


def _collectives_waited_for(
    comm: Sequence[dict[str, Any]], comm_index: dict[int, int], launched: int, prev_end: float, start_s: float
) -> tuple[list[int], float]:
    """The op indices of the launched collectives that finished in the gap before an op
    starting at `start_s`, and when the last of them (or the previous op) ended."""
    deps, issue_from = [], prev_end
    for k in range(launched):
        end = comm[k]["end_s"]
        if prev_end < end <= start_s and k in comm_index:
            deps.append(comm_index[k])
            issue_from = max(issue_from, end)
    return deps, issue_from


def _resume_op(deps: list[int], gap: float) -> GraphOp:
    """Blocked in `wait`: the thread resumes `gap` after the collectives end. As an op of its
    own, this wake-up is charged after the wait, not hidden behind it."""
    return GraphOp(RESUME, "compute", RESUME, {}, deps=sorted(set(deps)), duration_s=gap, issue_s=0.0, blocking=True)


def _traced_op(op: dict[str, Any], deps: list[int], gap: float) -> GraphOp:
    """A top-level op of the step's thread, issued `gap` after the thread was free."""
    host_s = op["end_s"] - op["start_s"]
    params = {"shapes": op.get("shapes", [])}
    if op.get("bytes"):  # a c10d launch's message, where the trace knew it (predictors/kineto_trace.py)
        params["bytes"] = op["bytes"]
    if op.get("device_s") is not None:  # a CUDA capture: the kernels run asynchronously for device_s,
        # the host's span is what issuing them cost the CPU thread
        return GraphOp(
            op["name"],
            "compute",
            op["name"],
            params,
            deps=deps,
            duration_s=float(op["device_s"]),
            issue_s=gap + host_s,
            blocking=False,
        )
    return GraphOp(op["name"], "compute", op["name"], params, deps=deps, duration_s=host_s, issue_s=gap, blocking=True)


def _collective_op(item: dict[str, Any], channel: str, launcher: int, world: int, transfer_s: float) -> GraphOp:
    """A collective work item, launched by op `launcher`, over all ranks, taking `transfer_s`."""
    return GraphOp(
        item["name"],
        "collective",
        item["name"].split(":")[-1],
        {},
        channel,
        [launcher],
        tuple(range(world)),
        duration_s=transfer_s,
        issue_s=0.0,
        blocking=False,
    )


def _rank_ops(trace: dict[str, Any], world: int, transfer_s: Sequence[float], offset_s: float) -> list[GraphOp]:
    ops: list[GraphOp] = []
    comm = trace["comm"]
    comm_index: dict[int, int] = {}  # k-th collective → its op index
    channel = _comm_channels(comm)
    next_comm = 0
    prev_end = 0.0
    # The step's end is one more (empty) op, so a tail spent waiting for the last collective,
    # or in Python after the last dispatcher op, is part of the rank's time as it was measured.
    end_mark = {"name": STEP_END, "start_s": trace["step_s"], "end_s": trace["step_s"], "shapes": []}
    for op in list(trace["ops"]) + [end_mark]:
        deps, issue_from = _collectives_waited_for(comm, comm_index, next_comm, prev_end, op["start_s"])
        gap = max(op["start_s"] - issue_from, 0.0) + (offset_s if not ops else 0.0)
        if deps:
            ops.append(_resume_op(deps, gap))
            deps, gap = [len(ops) - 1], 0.0
        ops.append(_traced_op(op, deps, gap))
        launcher = len(ops) - 1
        prev_end = op["end_s"]
        # The collective this launch started: the next work item, if it started no earlier than the launch.
        if (
            op["name"].startswith(LAUNCH_PREFIX)
            and next_comm < len(comm)
            and comm[next_comm]["start_s"] >= op["start_s"]
        ):
            item = comm[next_comm]
            ops.append(_collective_op(item, channel[item.get("thread", 0)], launcher, world, transfer_s[next_comm]))
            comm_index[next_comm] = len(ops) - 1
            next_comm += 1
    if next_comm != len(comm):
        raise ValueError(f"{len(comm) - next_comm} collective work item(s) have no launching c10d op")
    return ops


def start_offsets(steps: Sequence[dict[str, Any]], hosts: Sequence[str] | None) -> list[float]:
    """How much later than the earliest rank each rank started its step: from the host's
    monotonic clock when every rank ran on the same host (else clocks differ: zeros)."""
    clocks = [s.get("start_clock_s") for s in steps]
    if hosts is None or len(set(hosts)) != 1 or any(c is None for c in clocks):
        return [0.0] * len(steps)
    known = [float(c) for c in clocks if c is not None]
    return [c - min(known) for c in known]


def measured_iteration_s(steps: Sequence[dict[str, Any]], hosts: Sequence[str] | None = None) -> float:
    """The step as the ranks ran it: from the earliest rank's start to the latest rank's end."""
    return max(o + s["step_s"] for o, s in zip(start_offsets(steps, hosts), steps))


def graph_from_traces(steps: Sequence[dict[str, Any]], hosts: Sequence[str] | None = None) -> ExecutionGraph:
    """One captured step per rank (an element of a trace's `steps`), rank order. With `hosts`
    (each trace's `host`) all equal, each rank starts at its measured offset."""
    transfer = _collective_durations(steps)
    offsets = start_offsets(steps, hosts)
    ranks = [_rank_ops(t, len(steps), transfer, off) for t, off in zip(steps, offsets)]
    return ExecutionGraph(
        ranks, meta={"source": "trace", "measured_step_s": [t["step_s"] for t in steps], "start_offsets_s": offsets}
    )


def compare_gemms(graph: ExecutionGraph, predict: Callable[[int, int, int, str, int], float]) -> list[dict[str, Any]]:
    """Per distinct (op, shape) of rank 0: count, measured and predicted seconds (each)."""
    seen: dict[tuple, list[float]] = defaultdict(list)
    for op in graph.ranks[0]:
        shape = gemm_params_from_shapes(op.op, op.params.get("shapes", []))
        if shape is not None and op.duration_s is not None:
            seen[(op.op, shape)].append(op.duration_s)
    rows = []
    for (name, shape), times in seen.items():
        times.sort()
        rows.append(
            {
                "op": name,
                "mnk_variant_batch": list(shape),
                "count": len(times),
                "measured_s": times[len(times) // 2],
                "predicted_s": predict(*shape),
            }
        )
    return rows

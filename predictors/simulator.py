"""Critical-path simulation of one iteration over an `ExecutionGraph`.

Summing kernel times ignores waiting. Per rank the simulator keeps a CPU time front and one
front per stream:
- the CPU issues ops in order, paying each op's CPU-side overhead; an op starts at
  max(CPU issue time, its stream's front, the end of every op it depends on) — the intra-rank
  synchronisation that makes a kernel wait for the collective whose output it reads;
- a collective starts only when the last member of its group has arrived and ends for all
  members together — the inter-rank synchronisation;
- on a synchronous device (a CPU, or gloo collectives) an op also holds the CPU until it
  ends, so nothing overlaps it on that rank;
- a posted collective (a point-to-point send, `GraphOp.posted`) does not stop its rank: the
  rank goes on once it is issued, and the transfer runs when its receiver arrives;
- collectives on different communication streams of a rank (a DP all-reduce beside a TP
  one, several gloo channels) share that rank's link for their scope (intra- or
  inter-node): with `share_links`, one that starts while another still holds a member's
  link starts when it frees. For the pair this is the makespan of fair bandwidth sharing
  (both at half rate while they overlap, the later one ends `overlap` later than alone),
  kept in issue order so ops already placed never move.
The iteration time is the latest front over ranks. The result keeps per-rank, per-stream
busy time, the communication time not hidden behind compute (exposed), and the critical path.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from predictors.graph import ExecutionGraph, GraphOp, is_comm_stream

CostFn = Callable[[GraphOp], float]


@dataclass
class RankTimeline:
    end_s: float = 0.0
    cpu_s: float = 0.0
    busy_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    exposed_comm_s: float = 0.0
    waiting_s: float = 0.0  # time spent waiting for other ranks at collectives


@dataclass
class SimResult:
    iteration_s: float
    ranks: list[RankTimeline]
    critical_path: list[tuple[int, int, str]]  # (rank, op index, name), first to last
    spans: list[list[tuple[float, float]]]  # per rank, per op: (start, end)

    def to_dict(self) -> dict:
        return {
            "iteration_ms": self.iteration_s * 1e3,
            "ranks": [
                {
                    "end_ms": r.end_s * 1e3,
                    "cpu_ms": r.cpu_s * 1e3,
                    "exposed_comm_ms": r.exposed_comm_s * 1e3,
                    "waiting_ms": r.waiting_s * 1e3,
                    "busy_ms": {k: v * 1e3 for k, v in r.busy_s.items()},
                }
                for r in self.ranks
            ],
            "critical_path": [f"r{r}:{name}" for r, _, name in self.critical_path],
        }


class DeadlockError(RuntimeError):
    """Ranks wait on collectives that can never meet (mismatched order or groups)."""


Blame = tuple[int, int] | None  # the (rank, op index) an op waited for last: the critical path's edge
Arrival = tuple[float, int, Blame]  # a group member's (ready time, op index, blame) at a collective


def simulate(
    graph: ExecutionGraph,
    cost: CostFn,
    cpu_overhead: CostFn | None = None,
    synchronous: bool = False,
    share_links: bool = True,
) -> SimResult:
    """Simulate one iteration. `cost(op)` is the op's device time, `cpu_overhead(op)` the
    CPU time to issue it (default 0); `synchronous` makes every op hold the issuing CPU;
    `share_links` queues concurrent collectives on a rank's link (off for imported traces,
    whose measured transfer times already include the sharing).
    An op's own measured `duration_s` / `issue_s` / `blocking` (imported traces) win."""
    model_overhead = cpu_overhead or (lambda _op: 0.0)

    def overhead(o: GraphOp) -> float:
        return o.issue_s if o.issue_s is not None else model_overhead(o)

    sim = _Simulation(graph, cost, overhead, synchronous, share_links)
    sim.run()
    return sim.result()


class _Simulation:
    """What one `simulate` call advances: per rank a CPU front, one front per stream, the
    collectives it waits at and its links' fronts; per op its span and what it waited for."""

    def __init__(
        self, graph: ExecutionGraph, cost: CostFn, overhead: CostFn, synchronous: bool, share_links: bool
    ) -> None:
        n = graph.world_size
        self.graph, self.cost, self.overhead = graph, cost, overhead
        self.synchronous, self.share_links = synchronous, share_links
        self.cpu = [0.0] * n
        self.fronts: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
        self.spans: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(ops) for ops in graph.ranks]
        self.blamed: list[list[Blame]] = [[None] * len(ops) for ops in graph.ranks]
        self.last_on_stream: list[dict[str, int]] = [dict() for _ in range(n)]
        self.last_issued = [-1] * n
        self.timelines = [RankTimeline() for _ in range(n)]
        self.position = [0] * n
        # Collectives are matched per group in issue order: the k-th on a group meets the k-th.
        self.arrivals: dict[tuple[tuple[int, ...], int], dict[int, Arrival]] = defaultdict(dict)
        self.seen_on_group: list[dict[tuple[int, ...], int]] = [defaultdict(int) for _ in range(n)]
        self.link_free: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]  # per rank, per scope
        self.link_holder: list[dict[str, tuple[int, int]]] = [dict() for _ in range(n)]
        self.ready = deque(range(n))

    def run(self) -> None:
        """Advance ranks until none can go on; a rank that stopped at an unmet collective is
        re-queued by the last member to arrive."""
        while self.ready:
            self.advance(self.ready.popleft())
        ranks, position = self.graph.ranks, self.position
        stuck = [r for r in range(len(ranks)) if position[r] < len(ranks[r])]
        if stuck:
            raise DeadlockError(f"ranks {stuck} wait at {[ranks[r][position[r]].name for r in stuck]}")
        unmatched = sorted(ranks[r][a[1]].name for arrived in self.arrivals.values() for r, a in arrived.items())
        if unmatched:
            raise DeadlockError(f"posted sends never received: {unmatched[:10]}")

    def advance(self, r: int) -> None:
        """Issue rank `r`'s ops in order until it ends or waits at a collective."""
        ops = self.graph.ranks[r]
        while self.position[r] < len(ops):
            i = self.position[r]
            o = ops[i]
            if o.kind != "collective":
                self.issue(r, i, o)
                self.position[r] += 1
                continue
            key = (o.group, self.seen_on_group[r][o.group])
            arrived = self.arrivals[key]
            if r not in arrived:
                self.cpu[r] += self.overhead(o)
                t, who = self.ready_time(r, o)
                arrived[r] = (t, i, who)
                if o.posted:  # the rank goes on; the transfer is placed when its receiver arrives
                    self.seen_on_group[r][o.group] += 1
                    self.position[r] += 1
            if len(arrived) < len(o.group):
                if o.posted:
                    continue
                break  # wait for the others; they will re-queue this rank
            self.retire(r, o, arrived)
            del self.arrivals[key]

    def issue(self, r: int, i: int, o: GraphOp) -> None:
        """Run a compute or memory op: the CPU pays its overhead, it starts once ready."""
        self.cpu[r] += self.overhead(o)
        start, who = self.ready_time(r, o)
        dur = o.duration_s if o.duration_s is not None else self.cost(o)
        self.finish(r, i, o, start, start + dur, who)

    def ready_time(self, r: int, o: GraphOp) -> tuple[float, Blame]:
        """When `o` can start on rank `r`, and the op it waited for last."""
        t, who = self.cpu[r], ((r, self.last_issued[r]) if self.last_issued[r] >= 0 else None)
        if self.fronts[r][o.stream] > t:
            t, who = self.fronts[r][o.stream], (r, self.last_on_stream[r][o.stream])
        spans = self.spans[r]
        for d in o.deps:
            if spans[d][1] > t:
                t, who = spans[d][1], (r, d)
        return t, who

    def finish(self, r: int, i: int, o: GraphOp, start: float, end: float, who: Blame) -> None:
        """Record op `i` of rank `r` as running from `start` to `end` and move the fronts."""
        self.spans[r][i] = (start, end)
        self.blamed[r][i] = who
        self.fronts[r][o.stream] = end
        self.last_on_stream[r][o.stream] = i
        if o.posted:  # the rank went on past it: it neither holds the CPU nor orders later issues
            self.timelines[r].busy_s[o.stream] += end - start
            return
        self.last_issued[r] = i
        if o.blocking if o.blocking is not None else self.synchronous:
            self.cpu[r] = end
        self.timelines[r].busy_s[o.stream] += end - start

    def retire(self, r: int, o: GraphOp, arrived: dict[int, Arrival]) -> None:
        """Run a collective every member of whose group has arrived: it starts when the last
        arrives (or its link frees) and ends for all members together."""
        start = max(a[0] for a in arrived.values())
        late_rank, (_, late_i, _) = max(arrived.items(), key=lambda kv: kv[1][0])
        scope = str(o.params.get("scope", "intra")) if o.params else "intra"
        held_by = None
        if self.share_links:
            busy, holder = max((self.link_free[m][scope], m) for m in arrived)
            if busy > start:  # the link is still carrying another stream's collective
                start, held_by = busy, self.link_holder[holder][scope]
        dur = o.duration_s if o.duration_s is not None else self.cost(o)
        for member, (t_arrive, idx, who) in arrived.items():
            m_op = self.graph.ranks[member][idx]
            # The late arriver waited on its own predecessor; everyone else waited on it.
            blame = held_by or (who if member == late_rank else (late_rank, late_i))
            self.timelines[member].waiting_s += start - t_arrive
            self.finish(member, idx, m_op, start, start + dur, blame)
            self.link_free[member][scope] = start + dur
            self.link_holder[member][scope] = (member, idx)
            if m_op.posted:  # its rank moved past it when it was issued
                continue
            self.seen_on_group[member][o.group] += 1
            self.position[member] += 1
            if member != r:
                self.ready.append(member)

    def result(self) -> SimResult:
        """Each rank's ends, CPU time and exposed communication; the iteration ends with the last."""
        graph, cpu, timelines = self.graph, self.cpu, self.timelines
        for r in range(graph.world_size):
            tl = timelines[r]
            tl.cpu_s = cpu[r]
            tl.end_s = max([cpu[r]] + list(self.fronts[r].values()))
            tl.exposed_comm_s = _exposed(self.spans[r], graph.ranks[r])
        iteration = max((tl.end_s for tl in timelines), default=0.0)
        return SimResult(iteration, timelines, _critical_path(graph, self.spans, self.blamed), self.spans)


def _exposed(spans: list[tuple[float, float]], ops: list[GraphOp]) -> float:
    """Communication time during which no compute-stream op of the rank runs.

    Compute spans are merged into disjoint intervals with prefix sums of their lengths, so each
    collective's covered time is two binary searches (a rank has tens of thousands of ops)."""
    merged: list[list[float]] = []
    for start, end in sorted(s for s, o in zip(spans, ops) if o.stream == "compute" and s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    starts = [m[0] for m in merged]
    prefix = [0.0]
    for a, b in merged:
        prefix.append(prefix[-1] + (b - a))

    def covered_until(t: float) -> float:
        """Compute time in [0, t]."""
        k = bisect.bisect_right(starts, t)  # intervals starting at or before t
        if k == 0:
            return 0.0
        a, b = merged[k - 1]
        return prefix[k - 1] + (min(t, b) - a)

    exposed = 0.0
    for (start, end), o in zip(spans, ops):
        if is_comm_stream(o.stream) and end > start:
            exposed += max(0.0, (end - start) - (covered_until(end) - covered_until(start)))
    return exposed


def _critical_path(graph: ExecutionGraph, spans, blamed) -> list[tuple[int, int, str]]:
    """Walk back from the op that ends last through whatever each op waited for."""
    best = None
    for r, rank_spans in enumerate(spans):
        for i, (_, end) in enumerate(rank_spans):
            if best is None or end > spans[best[0]][best[1]][1]:
                best = (r, i)
    path = []
    seen = set()
    while best is not None and best not in seen:
        seen.add(best)
        r, i = best
        path.append((r, i, graph.ranks[r][i].name))
        best = blamed[r][i]
    return path[::-1]


def model_cost(
    model,
    unpriced: set[str] | None = None,
    in_context: bool = True,
    memo: dict[tuple, Any] | None = None,
    workload: str | None = None,
) -> CostFn:
    """Device time of a graph op from a fitted `PerformanceModel` (ops of empty table sets: 0).

    An op the bundle has no model for (a bundle calibrated before that family was probed, or
    with too few rows to fit it) costs 0 and its name is added to `unpriced` when given, so
    callers can report the estimate as a lower bound instead of failing the whole plan.
    Kernels and collectives are corrected by the bundle's in-context model (`in_context`) when
    it has one: the isolated probes' times, mapped to what a training step of `workload`
    ("dlrm", "transformer") really sees; a factor scoped to other workloads' steps (the
    collectives', `predictors.step_fit.fit_steps`) leaves its op at the isolated price.
    Each distinct op and params is priced once (every rank repeats the dense layers' ops);
    `memo` keeps the prices across calls on the same model (a planner pricing many plans).
    """
    context = model.in_step if in_context else None
    priced: dict[tuple, Any] = memo if memo is not None else {}

    def cost(op: GraphOp) -> float:
        if not op.params:
            return 0.0
        if unpriced is not None and op.op not in model.models:
            unpriced.add(op.op)
            return 0.0
        key = (in_context, workload, op.op, frozen(op.params))
        if key in priced:
            return priced[key]
        seconds = model.predict_params(op.op, op.params)
        if context is not None:  # kernels and collectives alike (predictors/collective_context.py)
            seconds = context.in_step(op.op, seconds, workload)
        priced[key] = seconds
        return seconds

    return cost


def frozen(value: Any) -> Any:
    """An op's params as a key: dicts as sorted item tuples, lists (a TBE's reuse histogram)
    as tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


def model_cpu_overhead(model) -> CostFn:
    """CPU time to issue a graph op: the measured pooled dispatch + between-op gap medians
    (`cpu_overhead` rows from the training probes); 0 when the bundle has none."""
    overheads = model.dispatch
    if overheads is None:
        return lambda _op: 0.0
    per_op = sum(
        overheads.predict({"kind": kind, "aten_op": "*"})
        for kind in ("dispatch", "gap")
        if not overheads.out_of_range({"kind": kind, "aten_op": "*"})
    )

    def cost(op: GraphOp) -> float:
        return per_op if op.params else 0.0

    return cost

"""Chunk-level event simulator of a hierarchical all-reduce on a multi-dimensional network,
with the baseline schedule and Themis's (Rashidi et al., ISCA 2022).

An all-reduce of S bytes is cut into C equal chunks. Each chunk reduce-scatters through the
dimensions in some order (its data shrinks by the dimension's peer count at each stage),
all-reduces on the last one (a reduce-scatter and an all-gather back to back, one phase), then
all-gathers back through the others in reverse order. The network is symmetric, so one NPU
stands for all of them.

A dimension admits another chunk phase only while every phase it holds is still paying its
step latency (one chunk alone cannot saturate the dimension then), up to `max_active` (8 by
default; `None` for no cap, which hides every latency and so never penalises more chunks);
latencies overlap, while the bandwidth serves one phase at a time, in
admission order. With zero latency this is the one-phase-at-a-time pipeline of the paper's
figures. Which waiting phase
a dimension admits next is the intra-dimension policy: FIFO (first ready) or SCF (smallest
chunk first: the phase whose larger side, input or output, is smallest; ties by readiness).

Schedules:
- `baseline`: every chunk takes dimension 1, 2, ..., D; FIFO.
- `themis_fifo` / `themis_scf`: Themis's inter-dimension policy. A load tracker holds, per
  dimension, the transfer time (bytes / bandwidth) of every phase already assigned to it. For
  each chunk in turn, if the most and least loaded dimensions differ by more than the time a
  stage of 1/16 of a chunk takes on the least loaded one, the dimensions are sorted least loaded
  first, so the chunk's largest stages (its first reduce-scatter and last all-gather) land on
  the least loaded dimension; otherwise the baseline order is kept (the first chunk always
  is). The chunk's phase times are then added to the tracker. Intra-dimension: FIFO or SCF.

Bandwidth utilisation is the paper's: the bandwidth-weighted average over dimensions of the
share of time each dimension's bandwidth is in use, i.e. the bytes an NPU sent on all
dimensions over (the sum of their bandwidths x the all-reduce's time).

Everything is deterministic: ties break by chunk and phase index.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from predictors.network import NetworkTopology

SCHEDULES = ("baseline", "themis_fifo", "themis_scf")
DEFAULT_MAX_ACTIVE: int | None = 8  # phases whose latencies a dimension overlaps; None: no cap
THRESHOLD_FRACTION = (
    1 / 16
)  # Themis keeps the baseline order while loads differ by less than this share of a chunk's stage


class ChunkSimError(ValueError):
    """Inputs the chunk simulator refuses; the message names the argument."""


@dataclass(frozen=True)
class Phase:
    """One chunk's work on one dimension: a reduce-scatter, an all-gather, or on the chunk's
    last dimension both back to back ("ar"). `stages` are the real-execution stage indices
    (0..2D-1, see probes.vocabulary.chunks.ChunkSchedule) the phase covers."""

    dim: int
    kind: str  # "rs" | "ag" | "ar"
    data_bytes: float  # larger side: reduce-scatter input, all-gather output
    bytes_sent: float
    latency_s: float
    stages: tuple[int, ...]


@dataclass
class PhaseTiming:
    chunk: int
    index: int
    dim: int
    kind: str
    data_bytes: float
    start_s: float
    end_s: float


@dataclass
class ChunkSimResult:
    schedule: str
    chunks: int
    collective_bytes: float
    time_s: float
    dim_bytes: list[float]  # bytes one NPU sent on each dimension
    dim_busy_s: list[float]  # time each dimension held at least one phase
    dim_utilization: list[float]  # bytes sent / (bandwidth x time)
    utilization: float  # all dimensions' bytes / (sum of their bandwidths x time)
    orders: list[list[int]]  # per chunk, its reduce-scatter dimension order
    issue: list[tuple[int, int]]  # (chunk, real stage) in start order: what ranks issue
    phases: list[PhaseTiming] = field(default_factory=list)

    def to_dict(self, with_phases: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_phases:
            data.pop("phases")
        return data


def chunk_phases(topology: NetworkTopology, chunk_bytes: float, order: list[int]) -> list[Phase]:
    """A chunk's phases in order, for its reduce-scatter dimension order."""
    D = len(order)
    phases, size = [], chunk_bytes
    for k, d in enumerate(order[:-1]):
        dim = topology.dims[d]
        phases.append(Phase(d, "rs", size, dim.bytes_sent(size), dim.latency_s(), (k,)))
        size /= dim.peers
    last = topology.dims[order[-1]]
    phases.append(Phase(order[-1], "ar", size, 2 * last.bytes_sent(size), 2 * last.latency_s(), (D - 1, D)))
    for k, d in enumerate(reversed(order[:-1])):
        dim = topology.dims[d]
        size *= dim.peers
        phases.append(Phase(d, "ag", size, dim.bytes_sent(size), dim.latency_s(), (D + 1 + k,)))
    return phases


def chunk_orders(topology: NetworkTopology, chunks: int, chunk_bytes: float, schedule: str) -> list[list[int]]:
    """Per chunk, the reduce-scatter order of dimensions the schedule gives."""
    dims = len(topology.dims)
    baseline = list(range(dims))
    if schedule == "baseline":
        return [baseline[:] for _ in range(chunks)]
    bandwidth = [d.bandwidth_bps for d in topology.dims]
    loads = [0.0] * dims
    orders = []
    for _ in range(chunks):
        least = min(range(dims), key=lambda d: (loads[d], d))
        threshold = topology.dims[least].bytes_sent(chunk_bytes * THRESHOLD_FRACTION) / bandwidth[least]
        if max(loads) - loads[least] > threshold:
            order = sorted(baseline, key=lambda d: (loads[d], d))
        else:
            order = baseline[:]
        for phase in chunk_phases(topology, chunk_bytes, order):
            loads[phase.dim] += phase.bytes_sent / bandwidth[phase.dim]
        orders.append(order)
    return orders


def simulate_all_reduce(
    topology: NetworkTopology,
    collective_bytes: float,
    chunks: int,
    schedule: str = "themis_scf",
    max_active: int | None = DEFAULT_MAX_ACTIVE,
    keep_phases: bool = False,
) -> ChunkSimResult:
    _check_arguments(collective_bytes, chunks, schedule, max_active)
    chunks = int(chunks)
    chunk_bytes = collective_bytes / chunks
    orders = chunk_orders(topology, chunks, chunk_bytes, schedule)
    run = _ChunkRun(
        topology,
        [chunk_phases(topology, chunk_bytes, o) for o in orders],
        scf=schedule == "themis_scf",
        cap=math.inf if max_active is None else int(max_active),
    )
    run.run()
    now, timings, dim_bytes, bandwidth = run.now, run.timings, run.dim_bytes, run.bandwidth
    n_dims = len(topology.dims)
    timings.sort(key=lambda t: (t.start_s, t.chunk, t.index))
    issue = [(t.chunk, stage) for t in timings for stage in run.plans[t.chunk][t.index].stages]
    used = [d for d in range(n_dims) if topology.dims[d].peers > 1]
    return ChunkSimResult(
        schedule=schedule,
        chunks=chunks,
        collective_bytes=float(collective_bytes),
        time_s=now,
        dim_bytes=dim_bytes,
        dim_busy_s=run.dim_busy,
        dim_utilization=[dim_bytes[d] / (bandwidth[d] * now) for d in range(n_dims)],
        utilization=sum(dim_bytes[d] for d in used) / (sum(bandwidth[d] for d in used) * now),
        orders=orders,
        issue=issue,
        phases=timings if keep_phases else [],
    )


def _check_arguments(collective_bytes: float, chunks: int, schedule: str, max_active: int | None) -> None:
    if schedule not in SCHEDULES:
        raise ChunkSimError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    if int(chunks) != chunks or chunks < 1:
        raise ChunkSimError(f"chunks must be a positive integer, got {chunks!r}")
    if not collective_bytes > 0:
        raise ChunkSimError(f"collective_bytes must be > 0, got {collective_bytes!r}")
    if max_active is not None and (int(max_active) != max_active or max_active < 1):
        raise ChunkSimError(f"max_active must be a positive integer or None, got {max_active!r}")


class _ChunkRun:
    """The event loop over every chunk's phases: per dimension the phases waiting for it and
    those it admitted (`[chunk, latency left, bytes left]`, in admission order)."""

    def __init__(self, topology: NetworkTopology, plans: list[list[Phase]], scf: bool, cap: float) -> None:
        n_dims = len(topology.dims)
        self.plans, self.scf, self.cap = plans, scf, cap
        self.bandwidth = [d.bandwidth_bps for d in topology.dims]
        self.waiting: list[list[tuple[tuple, int]]] = [[] for _ in range(n_dims)]  # (priority, chunk)
        self.active: list[list[list]] = [[] for _ in range(n_dims)]
        self.current = [0] * len(plans)  # index of each chunk's phase in progress or waiting
        self.started = [0.0] * len(plans)
        self.timings: list[PhaseTiming] = []
        self.dim_bytes = [0.0] * n_dims
        self.dim_busy = [0.0] * n_dims
        self.seq = 0
        self.now = 0.0
        for c in range(len(plans)):
            self.make_ready(c, 0.0)

    def make_ready(self, chunk: int, now: float) -> None:
        """Queue the chunk's next phase on its dimension, ranked by the intra-dimension policy."""
        phase = self.plans[chunk][self.current[chunk]]
        self.waiting[phase.dim].append(((phase.data_bytes, now, self.seq) if self.scf else (now, self.seq), chunk))
        self.seq += 1

    def run(self) -> None:
        remaining = sum(len(p) for p in self.plans)
        while remaining:
            self.admit()
            dt, senders = self.next_step()
            self.now += dt
            remaining -= self.advance(dt, senders)

    def admit(self) -> None:
        """Another phase is admitted only while every admitted one is still paying its latency
        (the bandwidth would idle): several chunks at once only when one cannot saturate the
        dimension."""
        for d, (waiting, active) in enumerate(zip(self.waiting, self.active)):
            while waiting and len(active) < self.cap and all(a[1] > 0.0 for a in active):
                i = min(range(len(waiting)), key=lambda j: waiting[j][0])
                _, c = waiting.pop(i)
                phase = self.plans[c][self.current[c]]
                active.append([c, phase.latency_s, phase.bytes_sent])
                self.started[c] = self.now

    def next_step(self) -> tuple[float, list[list | None]]:
        """Time to the next event, and per dimension the phase its bandwidth serves: the
        earliest admitted one past its latency."""
        dt = math.inf
        senders: list[list | None] = [None] * len(self.active)
        for d, active in enumerate(self.active):
            for a in active:
                if a[1] > 0.0:
                    dt = min(dt, a[1])
                elif senders[d] is None:
                    senders[d] = a
                    dt = min(dt, a[2] / self.bandwidth[d])
        if dt is math.inf:  # pragma: no cover - every admitted phase either waits out latency or sends
            raise ChunkSimError("no phase can progress (internal error)")
        return dt, senders

    def advance(self, dt: float, senders: list[list | None]) -> int:
        """Move every dimension on by `dt`; returns how many phases ended."""
        ended = 0
        for d, active in enumerate(self.active):
            if not active:
                continue
            self.dim_busy[d] += dt
            for a in active:
                if a[1] > 0.0:
                    a[1] = a[1] - dt if a[1] - dt > 1e-15 else 0.0
            sender = senders[d]
            if sender is not None:
                sent = min(sender[2], self.bandwidth[d] * dt)
                if sender[2] - sent <= 1e-9 * max(sent, 1.0):
                    sent = sender[2]
                sender[2] -= sent
                self.dim_bytes[d] += sent
            for a in [a for a in active if a[1] == 0.0 and a[2] == 0.0]:
                active.remove(a)
                self.retire(a[0])
                ended += 1
        return ended

    def retire(self, c: int) -> None:
        """Record chunk `c`'s phase as ended now and queue its next one."""
        phase = self.plans[c][self.current[c]]
        self.timings.append(
            PhaseTiming(c, self.current[c], phase.dim, phase.kind, phase.data_bytes, self.started[c], self.now)
        )
        self.current[c] += 1
        if self.current[c] < len(self.plans[c]):
            self.make_ready(c, self.now)

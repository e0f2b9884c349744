"""Chunk policy: how many chunks to cut a hierarchical all-reduce into, and which schedule to
run them with, chosen by simulating every option.

Too few chunks and the per-dimension loads cannot balance (and the pipeline across dimensions
never fills); too many and every chunk pays each stage's step latency. The policy sweeps the
chunk counts (powers of two, 1..512 by default) under every schedule with the chunk simulator
and keeps the fastest; the whole sweep is the decision's table. The chosen option comes with
its per-chunk dimension orders and issue order as a `ChunkSchedule`, which
`probes.workloads.hierarchical_allreduce` executes as is.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from policies.plan import Candidate, Decision
from policies.policy import Estimator, decide, decision_for, predicted
from predictors.chunk_sim import DEFAULT_MAX_ACTIVE, SCHEDULES, ChunkSimError, simulate_all_reduce
from predictors.network import NetworkTopology
from probes.vocabulary.chunks import ChunkSchedule

DEFAULT_CHUNK_COUNTS = tuple(2**k for k in range(10))  # 1 .. 512

ChunkOption = tuple[str, int]  # (schedule, chunk count)


def candidate_name(schedule: str, chunks: int) -> str:
    return f"{schedule}/{chunks}"


def simulated_estimator(
    topology: NetworkTopology, collective_bytes: float, max_active: int | None = DEFAULT_MAX_ACTIVE
) -> Estimator[ChunkOption]:
    """Prices a (schedule, chunks) option with the chunk simulator on `topology`."""

    def estimate(name: str, option: ChunkOption) -> Candidate:
        schedule, chunks = option
        result = simulate_all_reduce(topology, collective_bytes, chunks, schedule, max_active=max_active)
        return Candidate(
            name,
            result.time_s * 1e3,
            True,
            {
                "schedule": schedule,
                "chunks": chunks,
                "utilization": result.utilization,
                "dim_utilization": result.dim_utilization,
            },
        )

    return estimate


class ChunkingPolicy:
    """Every (schedule, chunk count); the fastest wins, its schedule ready to execute."""

    name = "chunking"

    def __init__(
        self,
        topology: NetworkTopology,
        collective_bytes: float,
        chunk_counts: Sequence[int] = DEFAULT_CHUNK_COUNTS,
        schedules: Sequence[str] = SCHEDULES,
        max_active: int | None = DEFAULT_MAX_ACTIVE,
    ):
        unknown = [s for s in schedules if s not in SCHEDULES]
        if unknown:
            raise ChunkSimError(f"schedules must be among {', '.join(SCHEDULES)}; got {unknown}")
        if not chunk_counts:
            raise ChunkSimError("chunk_counts is empty")
        self.topology, self.collective_bytes, self.max_active = topology, float(collective_bytes), max_active
        self.chunk_counts, self.schedules = [int(c) for c in chunk_counts], list(schedules)

    def options(self) -> Iterable[tuple[str, ChunkOption]]:
        for schedule in self.schedules:
            for chunks in self.chunk_counts:
                yield candidate_name(schedule, chunks), (schedule, chunks)

    def choose(self, priced: list[Candidate], estimate: Estimator[ChunkOption]) -> Decision:
        # Fastest first; among equal times the fewer chunks (less to launch), then schedule order.
        order = {s: i for i, s in enumerate(SCHEDULES)}
        candidates = sorted(
            priced, key=lambda c: (round(predicted(c), 9), c.detail["chunks"], order[c.detail["schedule"]])
        )
        first = candidates[0]
        best = simulate_all_reduce(
            self.topology,
            self.collective_bytes,
            first.detail["chunks"],
            first.detail["schedule"],
            max_active=self.max_active,
        )
        schedule = ChunkSchedule(
            dims=self.topology.peers, orders=tuple(tuple(o) for o in best.orders), issue=tuple(best.issue)
        )
        detail = {
            "topology": self.topology.to_dict(),
            "collective_bytes": self.collective_bytes,
            "max_active": self.max_active,
            "schedule": best.schedule,
            "chunks": best.chunks,
            "utilization": best.utilization,
            "chunk_schedule": schedule.to_dict(),
        }
        baseline = [c for c in candidates if c.detail["schedule"] == "baseline"]
        if baseline:
            detail["best_baseline"] = {
                "name": baseline[0].name,
                "predicted_ms": baseline[0].predicted_ms,
                "speedup": predicted(baseline[0]) / predicted(first),
            }
        return decision_for(self.name, first, candidates, detail)


def choose_chunking(
    topology: NetworkTopology,
    collective_bytes: float,
    chunk_counts: Sequence[int] = DEFAULT_CHUNK_COUNTS,
    schedules: Sequence[str] = SCHEDULES,
    max_active: int | None = DEFAULT_MAX_ACTIVE,
    estimate: Estimator[ChunkOption] | None = None,
) -> Decision:
    """Rank every (schedule, chunk count) by simulated all-reduce time (or by `estimate`). The
    choice's detail holds its schedule (dims, per-chunk orders, issue order) ready to execute."""
    policy = ChunkingPolicy(topology, collective_bytes, chunk_counts, schedules, max_active)
    return decide(policy, estimate or simulated_estimator(topology, collective_bytes, max_active))

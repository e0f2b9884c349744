"""Chunk policy: how many chunks to cut a hierarchical all-reduce into, and which schedule to
run them with, chosen by simulating every option.

Too few chunks and the per-dimension loads cannot balance (and the pipeline across dimensions
never fills); too many and every chunk pays each stage's step latency. The policy sweeps the
chunk counts (powers of two, 1..512 by default) under every schedule with the chunk simulator
and keeps the fastest; the whole sweep is the decision's table. The chosen option comes with
its per-chunk dimension orders and issue order as a `ChunkSchedule`, which
`probes.hierarchical_allreduce` executes as is.
"""
from __future__ import annotations

from typing import Sequence

from policies.plan import Candidate, Decision
from predictors.chunk_sim import DEFAULT_MAX_ACTIVE, SCHEDULES, ChunkSimError, simulate_all_reduce
from predictors.network import NetworkTopology
from probes.vocabulary.chunks import ChunkSchedule

DEFAULT_CHUNK_COUNTS = tuple(2 ** k for k in range(10))  # 1 .. 512


def candidate_name(schedule: str, chunks: int) -> str:
    return f"{schedule}/{chunks}"


def choose_chunking(topology: NetworkTopology, collective_bytes: float,
                    chunk_counts: Sequence[int] = DEFAULT_CHUNK_COUNTS,
                    schedules: Sequence[str] = SCHEDULES, max_active: int | None = DEFAULT_MAX_ACTIVE) -> Decision:
    """Rank every (schedule, chunk count) by simulated all-reduce time. The choice's detail
    holds its schedule (dims, per-chunk orders, issue order) ready to execute."""
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        raise ChunkSimError(f"schedules must be among {', '.join(SCHEDULES)}; got {unknown}")
    if not chunk_counts:
        raise ChunkSimError("chunk_counts is empty")
    candidates, results = [], {}
    for schedule in schedules:
        for chunks in chunk_counts:
            result = simulate_all_reduce(topology, collective_bytes, int(chunks), schedule, max_active=max_active)
            name = candidate_name(schedule, int(chunks))
            results[name] = result
            candidates.append(Candidate(name, result.time_s * 1e3, True, {
                "schedule": schedule, "chunks": int(chunks), "utilization": result.utilization,
                "dim_utilization": result.dim_utilization,
            }))
    # Fastest first; among equal times the fewer chunks (less to launch), then schedule order.
    order = {s: i for i, s in enumerate(SCHEDULES)}
    candidates.sort(key=lambda c: (round(c.predicted_ms, 9), c.detail["chunks"], order[c.detail["schedule"]]))
    best = results[candidates[0].name]
    schedule = ChunkSchedule(dims=topology.peers, orders=tuple(tuple(o) for o in best.orders),
                             issue=tuple(best.issue))
    baseline = [c for c in candidates if c.detail["schedule"] == "baseline"]
    detail = {
        "topology": topology.to_dict(), "collective_bytes": float(collective_bytes), "max_active": max_active,
        "schedule": best.schedule, "chunks": best.chunks, "utilization": best.utilization,
        "chunk_schedule": schedule.to_dict(),
    }
    if baseline:
        detail["best_baseline"] = {"name": baseline[0].name, "predicted_ms": baseline[0].predicted_ms,
                                   "speedup": baseline[0].predicted_ms / candidates[0].predicted_ms}
    return Decision(policy="chunking", choice=candidates[0].name, predicted_ms=candidates[0].predicted_ms,
                    candidates=candidates, choice_detail=detail)

"""Local search over per-table sharding types, starting from the best classic sharder.

The six classic sharders place whole tables (table-wise) by a proxy. TorchRec users can also
split a table by rows or columns or replicate it; which of those pays depends on the table
(a hot, wide table on an overloaded rank is worth splitting; a tiny table may be cheaper
replicated than exchanged) and on everything else in the plan, so the search prices whole
plans with the simulator rather than tables one by one (the critical path, not a per-rank sum).

Moves, per table: to another rank (table-wise; the least-loaded ranks first), row-wise over
every rank, column-wise over every rank, data-parallel (small tables only;
`probes.vocabulary.table_shards.split_kinds`). One node has no table-row-wise: it equals
row-wise within a node. The search is first-improvement hill
climbing: tables are visited in a seeded order, a move is kept when it lowers the predicted
iteration time by at least `min_gain` (relative), sweeps repeat until a whole sweep keeps
nothing or the evaluation budget is spent. Deterministic for a seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.table_shards import COLUMN_WISE, PlanEntry, split_kinds


@dataclass
class SearchResult:
    plan: list[PlanEntry]
    predicted_s: float
    start_s: float
    evaluations: int
    seconds: float
    moves: list[str] = field(default_factory=list)  # the kept moves, in order, with their gain
    exhausted: bool = False  # stopped by the evaluation or time budget, not at a local optimum

    def to_dict(self) -> dict:
        return {
            "plan": self.plan,
            "predicted_ms": self.predicted_s * 1e3,
            "start_ms": self.start_s * 1e3,
            "evaluations": self.evaluations,
            "seconds": self.seconds,
            "moves": self.moves,
            "exhausted": self.exhausted,
        }


def describe(entry: PlanEntry) -> str:
    if isinstance(entry, int):
        return f"rank {entry}"
    return entry["type"]


def rank_loads(spec: JobSpec, plan: Sequence[PlanEntry]) -> list[float]:
    """Each rank's pooled lookup volume (pooling x dimension of the whole tables it holds):
    the order in which a table's rank moves are tried, lightest first, so that a search its
    budget cuts short on hundreds of ranks has tried the moves likeliest to pay."""
    loads = [0.0] * spec.world_size
    for table, entry in zip(spec.tables, plan):
        if isinstance(entry, int):
            loads[entry] += table.pooling_factor * table.embedding_dim
    return loads


def table_moves(spec: JobSpec, i: int, entry: PlanEntry, loads: Sequence[float] | None = None) -> list[PlanEntry]:
    """Every other sharding of table i that the search may try: the other ranks (lightest
    first by `loads` when given), then the splits."""
    W, table = spec.world_size, spec.tables[i]
    ranks = sorted(range(W), key=lambda r: (loads[r], r)) if loads is not None else range(W)
    moves: list[PlanEntry] = [r for r in ranks if r != entry]
    for kind in split_kinds(table.num_embeddings, table.embedding_dim, W):
        moves.append({"type": kind, "ranks": list(range(W))} if kind == COLUMN_WISE else {"type": kind})
    return [m for m in moves if m != entry]


def local_search(
    spec: JobSpec,
    start: Sequence[PlanEntry],
    cost: Callable[[list[PlanEntry]], float | None],
    seed: int = 0,
    min_gain: float = 0.01,
    max_evaluations: int = 2000,
    max_seconds: float = 20.0,
) -> SearchResult:
    """Improve `start` by single-table moves. `cost(plan)` is the predicted iteration time in
    seconds, or None when the plan does not fit in memory (the move is not taken)."""
    t0 = time.perf_counter()
    plan = list(start)
    best = cost(plan)
    if best is None:
        raise ValueError("the search's starting plan does not fit in memory")
    start_s, evaluations, moves = best, 1, []
    rng = np.random.default_rng(seed)
    exhausted = False
    improved = True
    loads = rank_loads(spec, plan)
    while improved and not exhausted:
        improved = False
        for i in rng.permutation(len(plan)):
            for move in table_moves(spec, int(i), plan[i], loads):
                if evaluations >= max_evaluations or time.perf_counter() - t0 > max_seconds:
                    exhausted = True
                    break
                trial = plan[:i] + [move] + plan[i + 1 :]
                evaluations += 1
                t = cost(trial)
                if t is not None and t < best * (1 - min_gain):
                    moves.append(
                        f"{spec.tables[i].name}: {describe(plan[i])} -> {describe(move)} ({(t - best) * 1e3:+.3f} ms)"
                    )
                    plan, best, improved = trial, t, True
                    loads = rank_loads(spec, plan)
                    break  # first improvement: go on with the next table
            if exhausted:
                break
    return SearchResult(plan, best, start_s, evaluations, time.perf_counter() - t0, moves, exhausted)

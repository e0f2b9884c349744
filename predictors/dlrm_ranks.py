"""Which ranks a DLRM's iteration depends on, and what runs beside each: from the ranks' own
lookups, the one part of a DLRM step that differs between its ranks (the dense layers, the
replicas and every collective are the same on all of them). The estimator simulates only the
ranks `dominant_ranks` keeps, and prices the shared memory system's slowdown candidate
(`memory_alongside`) from the others' lookups."""

from __future__ import annotations

from typing import Callable, Sequence

from predictors.graph import GraphOp
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.table_shards import TableShard, local_pieces
from probes.vocabulary.tbe_features import expected_features


def memory_alongside(
    busiest: int, memory_s: float, lookups: Sequence[tuple[float, float]], placement: RankPlacement
) -> float:
    """The busiest rank's memory-bound seconds that the other ranks on its node can run at the
    same time, summed over them: min(its memory-bound time, theirs) each.

    Why: on a host whose ranks share one memory system, a lookup may slow by what runs beside
    it, not by its own length. #26's cycle of 12-02 07:06 suggested it (random4's lookups, heavy
    on one rank and light on the other, ran at their alone speed in the step, random8's,
    balanced, 1.2x slower); three calibrations' own steps did not bear it out, so it is a
    candidate (`dlrm_estimator.CANDIDATE_FEATURES`), not a default feature. Ranks differ only in their lookups (`dominant_ranks`), so another rank's
    memory-bound time is the busiest rank's with its lookups in place of the busiest's. Where
    each rank has its own memory (a GPU's HBM) the fitted coefficient is what says it costs
    nothing."""
    node = placement.nodes[busiest]
    own = lookups[busiest][0] + lookups[busiest][1]
    return float(
        sum(
            min(memory_s, memory_s - own + fwd + bwd)
            for r, (fwd, bwd) in enumerate(lookups)
            if r != busiest and placement.nodes[r] == node
        )
    )


def lookup_times(
    spec: JobSpec, shards: Sequence[TableShard], cost: Callable[[GraphOp], float]
) -> list[tuple[float, float]]:
    """Per rank, its own table pieces' embedding forward and backward as the graph prices them
    (0 for a rank without any)."""
    bags = spec.batch_size * spec.world_size
    times = []
    for pieces in local_pieces(shards, spec.world_size):
        if not pieces:
            times.append((0.0, 0.0))
            continue
        feats = expected_features(pieces, bags, seed=spec.seed)
        times.append(
            (
                cost(GraphOp("embedding_fwd", "compute", "embedding_fwd", feats)),
                cost(GraphOp("embedding_bwd", "compute", "embedding_bwd", feats)),
            )
        )
    return times


def dominant_ranks(lookups: Sequence[tuple[float, float]]) -> list[int]:
    """The ranks the iteration's time depends on: those whose embedding forward or backward
    (`lookups`, per rank) no other rank's both exceed (one of each tie).

    A DLRM rank's ops differ from another's only in its lookups (the dense layers, the
    replicas and every collective are the same on all ranks, and every collective spans the
    whole world). A rank whose forward and backward lookups are no longer than another's
    reaches every collective no later and ends no later (the simulator only takes maxima and
    sums of non-negative times), so it never sets a collective's start or the iteration's
    end: leaving it out changes no simulated iteration time (a test compares). A 512-rank plan
    is then simulated on the few ranks of its Pareto front."""
    times: dict[tuple[float, float], int] = {}
    for r, key in enumerate(lookups):
        times.setdefault(key, r)
    front, best_bwd = [], -1.0
    for fwd, bwd in sorted(times, key=lambda k: (-k[0], -k[1])):  # longest forward first
        if bwd > best_bwd:
            front.append(times[(fwd, bwd)])
            best_bwd = bwd
    return sorted(front)

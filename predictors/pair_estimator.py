"""Measured compute + collective pairs priced by the bundle: the graph of one `PairPoint`,
its unfused and k-slice overlapped forms predicted, and the fits that turn measured pair rows
into the bundle's overlap costs and symmetric-memory ratios.

The overlapped forms' costs (`OverlapCosts`: slice overhead, the communication's compute share,
the transfer line) are fitted so that these predictions match the measured pairs; the
substitution policy then prices the same forms inside a job's graph.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from predictors.graph import ExecutionGraph, GraphOp
from predictors.overlap_fit import fit_overlap_costs, fit_transfer_line
from predictors.overlap_model import (
    PAIR_OPS,
    SLICE_COUNTS,
    OverlapCalibration,
    OverlapCosts,
    PairPrediction,
    SliceParams,
    group_rows_by_point,
    pair_graph,
    pairs_in,
    predict_forms,
    scale_gemm_rows,
)
from predictors.performance_model import PerformanceModel
from probes.vocabulary.ops import PAIR_OP, SYMM_MEM_OP, TRANSFER_OP, gemm_params
from probes.vocabulary.pairs import FLOAT, PairPoint, embedding_slice_features
from probes.vocabulary.records import Measurement


def isolated_cost(model: PerformanceModel) -> Callable[[GraphOp], float]:
    """Seconds of an op as its isolated probe measured it (measured durations win)."""

    def cost(op: GraphOp) -> float:
        if op.duration_s is not None:
            return op.duration_s
        return model.predict_params(op.op, op.params) if op.params else 0.0

    return cost


# -- standalone measured pairs --------------------------------------------------------------


def point_graph(point: PairPoint) -> ExecutionGraph:
    """The measured pair as a graph: each rank's producer, then the collective."""
    W = point.world
    coll = {"world": W, "scope": point.scope}
    if point.pair == "gemm_all_reduce":
        producers = [GraphOp("producer", "compute", "gemm", gemm_params(point.rows, point.cols, point.inner))] * W
        coll["bytes"] = FLOAT * point.rows * point.cols
        return pair_graph(
            producers, GraphOp("collective", "collective", "all_reduce", coll, "comm", [0], tuple(range(W))), point.pair
        )
    layout = point.exchange_layout()
    if point.pair == "gemm_all_to_all":
        producers = [
            GraphOp("producer", "compute", "gemm", gemm_params(max(1, layout.rows(r)), point.cols, point.inner))
            for r in range(W)
        ]
    else:
        producers = [
            GraphOp("producer", "compute", "embedding_fwd", embedding_slice_features(point, r, point.rows * W))
            for r in range(W)
        ]
    sends = [sum(layout.send_sizes(r)) for r in range(W)]
    recvs = [sum(layout.recv_sizes(r)) for r in range(W)]
    coll["bytes"] = FLOAT * max(sends + recvs)
    if len(set(sends + recvs)) > 1:
        coll["uneven"] = True
    return pair_graph(
        producers, GraphOp("collective", "collective", "all_to_all", coll, "comm", [0], tuple(range(W))), point.pair
    )


def point_slice_params(point: PairPoint) -> SliceParams:
    def params(rank: int, producer: GraphOp, slices: int) -> dict[str, Any]:
        if producer.op == "gemm" and point.pair == "gemm_all_to_all":  # rows go to ranks: sliced by rows
            p = producer.params
            return gemm_params(max(1, math.ceil(p["M"] / slices)), p["N"], p["K"])
        if producer.op == "gemm":
            return scale_gemm_rows(producer.params, slices)
        return embedding_slice_features(point, rank, max(1, math.ceil(point.rows * point.world / slices)))

    return params


def predict_point(
    point: PairPoint, model: PerformanceModel, costs: OverlapCosts, slice_counts: Sequence[int] = SLICE_COUNTS
) -> PairPrediction:
    graph = point_graph(point)
    cost = isolated_cost(model)
    return predict_forms(
        graph, pairs_in(graph)[0], costs, cost, point_slice_params(point), cost, model.synchronous, slice_counts
    )


def fit_overlap_calibration(model: PerformanceModel, rows: Sequence[Measurement]) -> OverlapCalibration:
    """Fit each pair kind's overlap costs to its measured `overlap_pair` rows, its transfer
    line first when there are `overlap_transfer` rows; kinds the bundle cannot price (no model
    for the producer or the collective) or without rows are left out."""
    transfers: dict[str, list[tuple[float, int, float]]] = {}
    for key, forms in group_rows_by_point([r for r in rows if r.op == TRANSFER_OP]).items():
        point = PairPoint(**dict(key))
        nbytes = point_graph(point).ranks[0][1].params["bytes"]
        transfers.setdefault(point.pair, []).extend((nbytes, k, row.median_s) for k, row in forms.items())
    lines = {pair: fit_transfer_line(samples)[:2] for pair, samples in transfers.items() if len(samples) >= 2}
    by_kind: dict[str, list] = {}
    for key, forms in group_rows_by_point([r for r in rows if r.op == PAIR_OP]).items():
        point = PairPoint(**dict(key))
        if any(op not in model.models for op in PAIR_OPS[point.pair]):
            continue
        times = {k: row.median_s for k, row in forms.items()}
        by_kind.setdefault(point.pair, []).append(
            (
                lambda costs, point=point, ks=tuple(k for k in times if k > 1): predict_point(point, model, costs, ks),
                times,
            )
        )
    return OverlapCalibration(
        {pair: fit_overlap_costs(points, lines.get(pair)) for pair, points in sorted(by_kind.items())}
    )


def fit_symm_mem(rows: Sequence[Measurement]) -> dict[str, dict[str, float]]:
    """Per pair kind, PyTorch's symmetric-memory fused kernels against the unfused pair at the
    same measured points: the geometric mean time ratio and how many points it rests on (kept
    in the bundle's meta as plain JSON; none where the kernels did not run, e.g. on CPU)."""
    unfused = {
        key: forms[1].median_s
        for key, forms in group_rows_by_point([r for r in rows if r.op == PAIR_OP]).items()
        if 1 in forms
    }
    ratios: dict[str, list[float]] = {}
    for key, forms in group_rows_by_point([r for r in rows if r.op == SYMM_MEM_OP]).items():
        if key in unfused and 1 in forms:
            ratios.setdefault(dict(key)["pair"], []).append(forms[1].median_s / unfused[key])
    return {pair: {"ratio": float(np.exp(np.mean(np.log(r)))), "n": len(r)} for pair, r in sorted(ratios.items())}

"""Fused compute + collective substitution: replace a pair by its overlapped form only where
the simulator predicts it pays.

For each substitutable pair of a job's execution graph (or a standalone measured pair), the
graph is simulated unfused and with the pair as a k-slice pipeline for k in 2, 4, 8, 16
(`predictors.overlap_model`), priced by the bundle's kernel and collective models and the
pair's fitted overlap costs. A pair is substituted, with the fastest k, when the predicted
time falls by more than `threshold` of the unfused time; a pair whose kind has no fitted costs
in the bundle is kept unfused and says why. The decision lists every pair with both
predictions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from policies.plan import Candidate, Decision
from predictors.graph import ExecutionGraph, GraphOp
from predictors.overlap_model import (
    PAIR_OPS, SLICE_COUNTS, SYMM_MEM_KEY, OverlapCalibration, OverlapCosts, PairPrediction, SliceParams,
    fit_overlap_costs, fit_transfer_line, fuse_as_one_kernel, group_rows_by_point, pair_graph, pairs_in,
    predict_forms, scale_gemm_rows, substitute,
)
from predictors.performance_model import PerformanceModel
from predictors.simulator import model_cost, simulate
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.pairs import SYMM_MEM_SLICES
from probes.vocabulary.pairs import FLOAT, PairPoint, embedding_slice_features
from probes.vocabulary.ops import PAIR_OP, SYMM_MEM_OP, TRANSFER_OP
from probes.vocabulary.records import Measurement

DEFAULT_THRESHOLD = 0.05  # substitute only for a predicted gain above 5% of the pair's graph time


def is_synchronous(model: PerformanceModel) -> bool:
    return model.meta.get("device_kind", "cpu") != "cuda"


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
        return pair_graph(producers, GraphOp("collective", "collective", "all_reduce", coll, "comm", [0], tuple(range(W))),
                          point.pair)
    layout = point.exchange_layout()
    if point.pair == "gemm_all_to_all":
        producers = [GraphOp("producer", "compute", "gemm", gemm_params(max(1, layout.rows(r)), point.cols, point.inner))
                     for r in range(W)]
    else:
        producers = [GraphOp("producer", "compute", "embedding_fwd",
                             embedding_slice_features(point, r, point.rows * W)) for r in range(W)]
    sends = [sum(layout.send_sizes(r)) for r in range(W)]
    recvs = [sum(layout.recv_sizes(r)) for r in range(W)]
    coll["bytes"] = FLOAT * max(sends + recvs)
    if len(set(sends + recvs)) > 1:
        coll["uneven"] = True
    return pair_graph(producers, GraphOp("collective", "collective", "all_to_all", coll, "comm", [0], tuple(range(W))),
                      point.pair)


def point_slice_params(point: PairPoint) -> SliceParams:
    def params(rank: int, producer: GraphOp, slices: int) -> dict[str, Any]:
        if producer.op == "gemm" and point.pair == "gemm_all_to_all":  # rows go to ranks: sliced by rows
            p = producer.params
            return gemm_params(max(1, math.ceil(p["M"] / slices)), p["N"], p["K"])
        if producer.op == "gemm":
            return scale_gemm_rows(producer.params, slices)
        return embedding_slice_features(point, rank, max(1, math.ceil(point.rows * point.world / slices)))
    return params


def predict_point(point: PairPoint, model: PerformanceModel, costs: OverlapCosts,
                  slice_counts: Sequence[int] = SLICE_COUNTS) -> PairPrediction:
    graph = point_graph(point)
    cost = isolated_cost(model)
    return predict_forms(graph, pairs_in(graph)[0], costs, cost, point_slice_params(point), cost,
                         is_synchronous(model), slice_counts)


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
            (lambda costs, point=point, ks=tuple(k for k in times if k > 1): predict_point(point, model, costs, ks), times))
    return OverlapCalibration({pair: fit_overlap_costs(points, lines.get(pair)) for pair, points in sorted(by_kind.items())})


def fit_symm_mem(rows: Sequence[Measurement]) -> dict[str, dict[str, float]]:
    """Per pair kind, PyTorch's symmetric-memory fused kernels against the unfused pair at the
    same measured points: the geometric mean time ratio and how many points it rests on (kept
    in the bundle's meta as plain JSON; none where the kernels did not run, e.g. on CPU)."""
    unfused = {key: forms[1].median_s for key, forms in group_rows_by_point([r for r in rows if r.op == PAIR_OP]).items()
               if 1 in forms}
    ratios: dict[str, list[float]] = {}
    for key, forms in group_rows_by_point([r for r in rows if r.op == SYMM_MEM_OP]).items():
        if key in unfused and 1 in forms:
            ratios.setdefault(dict(key)["pair"], []).append(forms[1].median_s / unfused[key])
    return {pair: {"ratio": float(np.exp(np.mean(np.log(r)))), "n": len(r)} for pair, r in sorted(ratios.items())}


@dataclass
class PairChoice:
    substitute: bool
    slices: int  # 1 = unfused
    prediction: PairPrediction
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"substitute": self.substitute, "slices": self.slices, "reason": self.reason,
                "predicted_unfused_ms": self.prediction.unfused_s * 1e3,
                "predicted_fused_ms": {str(k): v * 1e3 for k, v in self.prediction.fused_s.items()},
                "predicted_gain": self.prediction.gain()}


def decide(prediction: PairPrediction, threshold: float = DEFAULT_THRESHOLD) -> PairChoice:
    k, best = prediction.best()
    gain = prediction.gain()
    if gain > threshold:
        return PairChoice(True, k, prediction, f"{k} slices predicted {gain:.1%} faster (> {threshold:.0%})")
    return PairChoice(False, 1, prediction, f"best fused form ({k} slices) predicted {gain:+.1%} (needs > {threshold:.0%})")


# -- pairs of a job's execution graph -------------------------------------------------------

def choose_substitutions(graph: ExecutionGraph, model: PerformanceModel, slice_params: SliceParams,
                         threshold: float = DEFAULT_THRESHOLD, cost: Callable[[GraphOp], float] | None = None,
                         cpu_overhead: Callable[[GraphOp], float] | None = None,
                         slice_counts: Sequence[int] = SLICE_COUNTS) -> tuple[Decision, ExecutionGraph]:
    """Decide every substitutable pair of `graph`; return the decision and the graph with the
    chosen substitutions applied. Each pair is judged by the whole iteration's simulated time
    with only that pair changed, so a pair whose collective is already hidden gains nothing."""
    calibration = OverlapCalibration.of(model)
    symm = model.meta.get(SYMM_MEM_KEY, {})
    cost = cost or model_cost(model)
    collective_cost = isolated_cost(model)
    synchronous = is_synchronous(model)
    candidates, chosen = [], []
    substituted = graph
    unfused_s = simulate(graph, cost, cpu_overhead, synchronous=synchronous).iteration_s  # shared by every pair
    for pair in pairs_in(graph):
        costs = calibration.pairs.get(pair.pair)
        if costs is None:
            candidates.append(Candidate(pair.name, None, False, {
                "pair": pair.pair, "substitute": False,
                "reason": f"no fitted overlap costs for {pair.pair} in this bundle (calibrate with overlap probes)"}))
            continue
        choice = decide(predict_forms(graph, pair, costs, cost, slice_params, collective_cost, synchronous,
                                      slice_counts, cpu_overhead, unfused_s), threshold)
        detail = {"pair": pair.pair, **choice.to_dict()}
        fused_kernel = symm.get(pair.pair)
        if fused_kernel is not None:  # PyTorch's fused kernels, priced by their measured ratio
            fused_s = simulate(fuse_as_one_kernel(graph, pair, fused_kernel["ratio"], collective_cost), cost,
                               cpu_overhead, synchronous=synchronous).iteration_s
            detail["predicted_symm_mem_ms"] = fused_s * 1e3
            best_sliced = choice.prediction.best()[1] if choice.substitute else unfused_s
            if fused_s < best_sliced and 1.0 - fused_s / unfused_s > threshold:
                detail.update(substitute=True, slices=SYMM_MEM_SLICES,
                              reason=f"PyTorch's symmetric-memory kernels predicted {1.0 - fused_s / unfused_s:.1%} "
                                     f"faster (> {threshold:.0%}; measured ratio {fused_kernel['ratio']:.2f})")
                choice = PairChoice(True, SYMM_MEM_SLICES, choice.prediction, detail["reason"])
        candidates.append(Candidate(pair.name, choice.prediction.unfused_s * 1e3, True, detail))
        if choice.substitute:
            chosen.append(f"{pair.name}:k{choice.slices}")
            if choice.slices == SYMM_MEM_SLICES:
                substituted = fuse_as_one_kernel(substituted, pair, fused_kernel["ratio"], collective_cost)
            else:
                substituted = substitute(substituted, pair, choice.slices, costs, slice_params, collective_cost, cost)
    predicted = simulate(substituted, cost, cpu_overhead, synchronous=synchronous).iteration_s
    decision = Decision("substitution", ",".join(chosen) or "none", predicted * 1e3, candidates,
                        {"substitutions": {c.split(":")[0]: int(c.split(":k")[1]) for c in chosen},
                         "threshold": threshold, "unfused_ms": unfused_s * 1e3})
    return decision, substituted

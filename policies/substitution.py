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

from dataclasses import dataclass
from typing import Any, Callable, Sequence


from policies.plan import Candidate, Decision
from predictors.graph import ExecutionGraph, GraphOp
from predictors.overlap_model import (
    SLICE_COUNTS, PairPrediction, SliceParams,
    fuse_as_one_kernel, pairs_in,
    predict_forms, substitute,
)
from predictors.performance_model import PerformanceModel
from predictors.pair_estimator import isolated_cost
from predictors.simulator import model_cost, simulate
from probes.vocabulary.pairs import SYMM_MEM_SLICES

DEFAULT_THRESHOLD = 0.05  # substitute only for a predicted gain above 5% of the pair's graph time


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
    calibration = model.overlap
    symm = model.symm_mem
    cost = cost or model_cost(model)
    collective_cost = isolated_cost(model)
    synchronous = model.synchronous
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

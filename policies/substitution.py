"""Overlap substitution: run a compute + collective pair in its overlapped form only where the
simulator predicts it pays.

For each substitutable pair of a job's execution graph (or a standalone measured pair), the
graph is simulated unfused and with the pair as a k-slice pipeline for k in 2, 4, 8, 16
(`predictors.overlap_model`), priced by the bundle's kernel and collective models and the
pair's fitted overlap costs. A pair is substituted, with the fastest k, when the predicted
time falls by more than `threshold` of the unfused time; a pair whose kind has no fitted costs
in the bundle is kept unfused and says why. The decision lists every pair with both
predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from policies.plan import Candidate, Decision
from policies.policy import Estimator
from policies.policy import decide as decide_policy
from predictors.graph import ExecutionGraph, GraphOp
from predictors.overlap_model import (
    SLICE_COUNTS,
    PairPrediction,
    SliceParams,
    SubstitutablePair,
    fuse_as_one_kernel,
    pairs_in,
    predict_forms,
    substitute,
)
from predictors.pair_estimator import isolated_cost
from predictors.performance_model import PerformanceModel
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
        return {
            "substitute": self.substitute,
            "slices": self.slices,
            "reason": self.reason,
            "predicted_unfused_ms": self.prediction.unfused_s * 1e3,
            "predicted_fused_ms": {str(k): v * 1e3 for k, v in self.prediction.fused_s.items()},
            "predicted_gain": self.prediction.gain(),
        }


def decide(prediction: PairPrediction, threshold: float = DEFAULT_THRESHOLD) -> PairChoice:
    k, best = prediction.best()
    gain = prediction.gain()
    if gain > threshold:
        return PairChoice(True, k, prediction, f"{k} slices predicted {gain:.1%} faster (> {threshold:.0%})")
    return PairChoice(
        False, 1, prediction, f"best fused form ({k} slices) predicted {gain:+.1%} (needs > {threshold:.0%})"
    )


# -- pairs of a job's execution graph -------------------------------------------------------


@dataclass
class PairPricing:
    """What pricing a graph's pairs needs: the graph, the bundle and how to cost and slice ops."""

    graph: ExecutionGraph
    model: PerformanceModel
    slice_params: SliceParams
    cost: Callable[[GraphOp], float]
    cpu_overhead: Callable[[GraphOp], float] | None = None
    slice_counts: Sequence[int] = SLICE_COUNTS

    def __post_init__(self) -> None:
        self.collective_cost = isolated_cost(self.model)
        self.unfused_s = self.simulate(self.graph)  # shared by every pair

    def simulate(self, graph: ExecutionGraph) -> float:
        return simulate(graph, self.cost, self.cpu_overhead, synchronous=self.model.synchronous).iteration_s


def simulated_estimator(pricing: PairPricing) -> Estimator[SubstitutablePair]:
    """Prices a pair by simulating the whole iteration with only that pair changed: unfused,
    as a k-slice pipeline for each k, and as one fused kernel where its ratio was measured."""

    def estimate(name: str, pair: SubstitutablePair) -> Candidate:
        costs = pricing.model.overlap.pairs.get(pair.pair)
        if costs is None:
            return Candidate(
                name,
                None,
                False,
                {
                    "pair": pair.pair,
                    "substitute": False,
                    "reason": f"no fitted overlap costs for {pair.pair} in this bundle (calibrate with overlap probes)",
                },
            )
        prediction = predict_forms(
            pricing.graph,
            pair,
            costs,
            pricing.cost,
            pricing.slice_params,
            pricing.collective_cost,
            pricing.model.synchronous,
            pricing.slice_counts,
            pricing.cpu_overhead,
            pricing.unfused_s,
        )
        detail: dict[str, Any] = {
            "pair": pair.pair,
            "predicted_unfused_ms": prediction.unfused_s * 1e3,
            "predicted_fused_ms": {str(k): v * 1e3 for k, v in prediction.fused_s.items()},
            "predicted_gain": prediction.gain(),
        }
        fused_kernel = pricing.model.symm_mem.get(pair.pair)
        if fused_kernel is not None:  # PyTorch's fused kernels, priced by their measured ratio
            fused = fuse_as_one_kernel(pricing.graph, pair, fused_kernel["ratio"], pricing.collective_cost)
            detail["predicted_symm_mem_ms"] = pricing.simulate(fused) * 1e3
        return Candidate(name, prediction.unfused_s * 1e3, True, detail)

    return estimate


class SubstitutionPolicy:
    """Substitute each pair whose best fused form is predicted faster by more than `threshold`."""

    name = "substitution"

    def __init__(self, pricing: PairPricing, threshold: float = DEFAULT_THRESHOLD):
        self.pricing, self.threshold = pricing, threshold
        self.pairs = {pair.name: pair for pair in pairs_in(pricing.graph)}

    def options(self) -> Iterable[tuple[str, SubstitutablePair]]:
        return self.pairs.items()

    def choose(self, priced: list[Candidate], estimate: Estimator[SubstitutablePair]) -> Decision:
        chosen: dict[str, int] = {}
        judged = []  # the priced candidates with their verdicts (the estimator's records stay as they were)
        for candidate in priced:
            if candidate.feasible:
                choice = self._choice(candidate.detail)
                verdict = {"substitute": choice.substitute, "slices": choice.slices, "reason": choice.reason}
                candidate = replace(candidate, detail={**candidate.detail, **verdict})
                if choice.substitute:
                    chosen[candidate.name] = choice.slices
            judged.append(candidate)
        applied = apply_substitutions(self.pricing, chosen)
        unfused_ms = self.pricing.unfused_s * 1e3
        return Decision(
            self.name,
            ",".join(f"{n}:k{k}" for n, k in chosen.items()) or "none",
            self.pricing.simulate(applied) * 1e3,
            judged,
            {"substitutions": chosen, "threshold": self.threshold, "unfused_ms": unfused_ms},
        )

    def _choice(self, detail: dict[str, Any]) -> PairChoice:
        """The sliced pipeline's verdict, overruled by the fused kernels where they win by more."""
        unfused_s = detail["predicted_unfused_ms"] / 1e3
        prediction = PairPrediction(unfused_s, {int(k): v / 1e3 for k, v in detail["predicted_fused_ms"].items()})
        choice = decide(prediction, self.threshold)
        if "predicted_symm_mem_ms" not in detail:
            return choice
        fused_s = detail["predicted_symm_mem_ms"] / 1e3
        best_sliced = prediction.best()[1] if choice.substitute else unfused_s
        gain = 1.0 - fused_s / unfused_s
        if fused_s < best_sliced and gain > self.threshold:
            ratio = self.pricing.model.symm_mem[detail["pair"]]["ratio"]
            return PairChoice(
                True,
                SYMM_MEM_SLICES,
                prediction,
                f"PyTorch's symmetric-memory kernels predicted {gain:.1%} faster "
                f"(> {self.threshold:.0%}; measured ratio {ratio:.2f})",
            )
        return choice


def apply_substitutions(pricing: PairPricing, substitutions: dict[str, int]) -> ExecutionGraph:
    """`pricing.graph` with each named pair replaced by its chosen form (k slices, or the fused
    kernels for `SYMM_MEM_SLICES`)."""
    graph = pricing.graph
    pairs = {pair.name: pair for pair in pairs_in(pricing.graph)}
    for name, slices in substitutions.items():
        pair = pairs[name]
        if slices == SYMM_MEM_SLICES:
            ratio = pricing.model.symm_mem[pair.pair]["ratio"]
            graph = fuse_as_one_kernel(graph, pair, ratio, pricing.collective_cost)
        else:
            graph = substitute(
                graph,
                pair,
                slices,
                pricing.model.overlap.pairs[pair.pair],
                pricing.slice_params,
                pricing.collective_cost,
                pricing.cost,
            )
    return graph


def choose_substitutions(
    graph: ExecutionGraph,
    model: PerformanceModel,
    slice_params: SliceParams,
    threshold: float = DEFAULT_THRESHOLD,
    cost: Callable[[GraphOp], float] | None = None,
    cpu_overhead: Callable[[GraphOp], float] | None = None,
    slice_counts: Sequence[int] = SLICE_COUNTS,
    estimate: Estimator[SubstitutablePair] | None = None,
) -> Decision:
    """Decide every substitutable pair of `graph`. Each pair is judged by the whole iteration's
    simulated time with only that pair changed, so a pair whose collective is already hidden
    gains nothing; the decision's time is the graph's with every chosen pair applied
    (`apply_substitutions` builds that graph)."""
    pricing = PairPricing(graph, model, slice_params, cost or model_cost(model), cpu_overhead, slice_counts)
    return decide_policy(SubstitutionPolicy(pricing, threshold), estimate or simulated_estimator(pricing))

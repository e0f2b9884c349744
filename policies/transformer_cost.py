"""Iteration time of a GPT-style block stack under a data/tensor-parallel layout: the
critical-path simulator over the layout's execution graph, kernels priced by the fitted
bundle and each op's issue cost by the measured CPU-overhead distribution."""
from __future__ import annotations

from dataclasses import dataclass, field

from predictors.performance_model import PerformanceModel
from predictors.simulator import SimResult, model_cost, model_cpu_overhead, simulate
from predictors.transformer_graph import build_transformer_graph
from probes.workloads.transformer import TransformerSpec


@dataclass
class TransformerEstimate:
    iteration_s: float
    kernel_sum_s: float  # the sum-of-kernels baseline (slowest rank, no waiting, no overhead)
    simulation: SimResult
    problems: list[str] = field(default_factory=list)


def estimate_transformer_iteration(spec: TransformerSpec, model: PerformanceModel) -> TransformerEstimate:
    graph = build_transformer_graph(spec)
    unpriced: set[str] = set()
    cost = model_cost(model, unpriced)
    synchronous = model.meta.get("device_kind", "cpu") != "cuda"
    result = simulate(graph, cost, cpu_overhead=model_cpu_overhead(model), synchronous=synchronous)
    kernel_sum = max(sum(cost(op) for op in ops) for ops in graph.ranks)
    problems = sorted({p for ops in graph.ranks for op in ops if op.params and op.op in model.models
                       for p in model.models[op.op].out_of_range(op.params)})
    problems += [f"no model for {op}: priced at 0, the estimate is a lower bound" for op in sorted(unpriced)]
    return TransformerEstimate(result.iteration_s, kernel_sum, result, problems)

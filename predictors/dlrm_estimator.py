"""Predicted iteration time of a table-wise sharded DLRM, from the per-op models.

The kernels of an iteration are costed by the critical-path simulator over the job's execution
graph (`predictors.dlrm_graph`): ranks wait for each other at every collective, kernels wait
for the collectives they read. The plain sum it replaces is kept as the baseline: the slowest
rank's embedding forward + backward, the dense MLP GEMMs (forward and both backward products
per layer), the forward and backward pooled-embedding all-to-all, the DDP gradient all-reduce
per bucket. Either way the CPU-side framework overhead of a step is added; it is fitted from
short real training probes (`fit_overhead`): what their measured step time leaves over after
the kernels, as a function of the number of dense layers, tables and extra table pieces of
split or replicated tables (per-op framework cost)
and of the busiest rank's kernel time in each class (`kernel_classes`: on a shared host, gloo's
threads and the compute thread slow each other in proportion to the work, and each class of
kernel by its own share; the fitted coefficients are those slowdowns). The overhead's params
also carry a candidate feature (`CANDIDATE_FEATURES`) that the default fit does not take: a
benchmark fits it beside the others on stored calibrations (`benchmarks/overhead_feature_refit.py`)
and it joins the default only when their steps bear it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from predictors.ddp_buckets import ddp_buckets
from predictors.dlrm_graph import FLOAT, build_dlrm_graph, shards_all_to_all_params
from predictors.dlrm_ranks import dominant_ranks, lookup_times, memory_alongside
from predictors.evaluation import ErrorStats, error_stats
from predictors.kernel_classes import ALL_KERNELS, KERNEL_CLASSES, MEMORY, MEMORY_ALONGSIDE, busiest_rank
from predictors.opmodels import fit_step_overhead, step_metrics
from predictors.performance_model import PerformanceModel
from predictors.simulator import frozen, model_cost, simulate
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP, gemm_params, linear_layer_gemms
from probes.vocabulary.placement import RankPlacement, placement_of
from probes.vocabulary.records import Measurement
from probes.vocabulary.table_shards import PlanEntry, TableShard, local_pieces, row_wise_width, table_shards
from probes.vocabulary.tbe_features import expected_features

# What a step leaves over its simulated kernels, fitted on the calibration's task-shaped steps
# (`step_fit.fit_steps`): a per-step constant, a cost per table and per table piece beyond one
# (each one more TBE table to launch and bookkeep), and one slowdown on all the kernels. Four
# coefficients for the twelve task steps a default calibration measures. Fitted on every step
# kind, with the kernels split by class and `dense_layers` and `pooled_elems` beside, the
# light and framework jobs pinned a small constant and a large slowdown (their steps follow
# other lines than a task's: README, #26), which priced small-batch jobs low and large-batch
# ones high; refitted on 11 stored #26 cycles (`benchmarks/step_fit_kinds.py`) the runs' worst
# task fell 5.5 points [1.7, 9.3] and their batch-128 tasks' lean against the run's mean rose
# 5.6 points [2.8, 8.4], their geomean unchanged.
OVERHEAD_FEATURES = ["one", "tables_total", "split_pieces", ALL_KERNELS]
# Carried in the params, fitted only by a benchmark's paired "with" (`overhead_feature_refit`):
# `memory_alongside_s`, of the memory-bound time what the node's other ranks run beside it (a
# lopsided plan's lookups run with little beside them; fitted on the #26 calibrations of
# 12-01 23:30, 12-02 03:36 and 07:06 its coefficient was 0 in all three); the kernels by class
# (`kernel_classes`); `dense_layers`; and `pooled_elems`, the framework's work on the pooled
# embeddings (batch x summed dims), which once lifted the small constant that the light jobs
# pinned.
CANDIDATE_FEATURES = [MEMORY_ALONGSIDE, *KERNEL_CLASSES, "dense_layers", "pooled_elems"]


@dataclass
class CostBreakdown:
    iteration_s: float
    embedding_fwd_s: list[float]  # per rank
    embedding_bwd_s: list[float]
    dense_s: float
    all_to_all_s: float  # forward + backward (with row-wise tables' reduce-scatter / all-gather)
    all_reduce_s: float
    overhead_s: float
    out_of_range: list[str]
    overhead_params: dict[str, float] = field(default_factory=dict)  # what the step overhead reads

    def to_dict(self) -> dict:
        return {
            "iteration_ms": self.iteration_s * 1e3,
            "embedding_fwd_ms": [x * 1e3 for x in self.embedding_fwd_s],
            "embedding_bwd_ms": [x * 1e3 for x in self.embedding_bwd_s],
            "dense_ms": self.dense_s * 1e3,
            "all_to_all_ms": self.all_to_all_s * 1e3,
            "all_reduce_ms": self.all_reduce_s * 1e3,
            "overhead_ms": self.overhead_s * 1e3,
            "out_of_range": self.out_of_range,
        }


def overhead_params(
    spec: JobSpec,
    kernels_s: float,
    plan: Sequence[PlanEntry] = (),
    shards: Sequence[TableShard] | None = None,
    classes: dict[str, float] | None = None,
) -> dict:
    """`split_pieces`: table pieces beyond one per table (a row-/column-wise or replicated table
    is a piece on every rank it spans, each one more TBE table to launch and bookkeep);
    `pooled_elems`: the pooled embeddings each rank's dense part takes (batch x the tables'
    summed dims, whatever the plan); `shards`: the plan's pieces when the caller has them
    already; `classes`: the busiest rank's kernels by class (`kernel_classes`)."""
    if shards is None:
        shards = table_shards(spec, plan) if plan else None
    pieces = len(shards) if shards is not None else len(spec.tables)
    return {
        "dense_layers": len(spec.dense_layers()),
        "tables_total": len(spec.tables),
        "world": spec.world_size,
        "split_pieces": pieces - len(spec.tables),
        "pooled_elems": float(spec.batch_size * sum(t.embedding_dim for t in spec.tables)),
        "kernels_s": float(kernels_s),
        **(classes or {}),
    }


Predict = Callable[..., float]  # op name and its params -> seconds, recording any out-of-range params


def _embedding_times(spec: JobSpec, shards: Sequence[TableShard], predict: Predict) -> tuple[list[float], list[float]]:
    """Per rank, the embedding forward and backward of its own (not replicated) table pieces."""
    emb_fwd, emb_bwd = [], []
    for local in local_pieces(shards, spec.world_size):
        if not local:
            emb_fwd.append(0.0)
            emb_bwd.append(0.0)
            continue
        feats = expected_features(local, spec.batch_size * spec.world_size, seed=spec.seed)
        emb_fwd.append(predict("embedding_fwd", **feats))
        emb_bwd.append(predict("embedding_bwd", **feats))
    return emb_fwd, emb_bwd


def _dense_time(spec: JobSpec, predict: Predict) -> float:
    """The dense MLP's GEMMs: each layer's forward and both backward products."""
    dense = 0.0
    for fan_in, fan_out in spec.dense_layers():
        for m, n, k in linear_layer_gemms(spec.batch_size, fan_in, fan_out):
            dense += predict("gemm", **gemm_params(m, n, k))
    return dense


def _exchange_time(spec: JobSpec, shards: Sequence[TableShard], scope: str, predict: Predict) -> float:
    """Pooled-embedding all-to-all, forward and backward (the largest per-rank send or
    receive), plus row-wise tables' reduce-scatter forward and all-gather backward."""
    W, B = spec.world_size, spec.batch_size
    a2a = 2 * predict("all_to_all", **shards_all_to_all_params(spec, shards, scope)) if W > 1 else 0.0
    rw = FLOAT * B * W * row_wise_width(shards)
    if W > 1 and rw:
        a2a += predict("reduce_scatter", bytes=rw, world=W, scope=scope) + predict(
            "all_gather", bytes=rw, world=W, scope=scope
        )
    return a2a


def _all_reduce_time(spec: JobSpec, scope: str, predict: Predict) -> float:
    """DDP's gradient all-reduce of the dense parameters, one collective per bucket."""
    W = spec.world_size
    param_bytes = 4 * sum(i * o + o for i, o in spec.dense_layers())
    return sum(predict("all_reduce", bytes=b, world=W, scope=scope) for b in ddp_buckets(param_bytes)) if W > 1 else 0.0


def _kernels(
    spec: JobSpec,
    table_to_rank: Sequence[PlanEntry],
    shards: Sequence[TableShard],
    placement: RankPlacement,
    model: PerformanceModel,
    problems: list[str],
    memo: dict | None = None,
    simulate_graph: bool = True,
) -> tuple[float | None, dict[str, float]]:
    """The kernels' critical path over the job's execution graph (None unless `simulate_graph`)
    and the busiest rank's kernels by class; ops without a model are priced at 0 and noted in
    `problems`."""
    unpriced: set[str] = set()
    cost = model_cost(model, unpriced, memo=memo, workload="dlrm")
    lookups = lookup_times(spec, shards, cost)
    ranks = dominant_ranks(lookups)
    graph = build_dlrm_graph(spec, table_to_rank, placement, shards=shards, ranks=ranks)
    kernels = simulate(graph, cost, synchronous=model.synchronous).iteration_s if simulate_graph else None
    problems.extend(f"no model for {op}: priced at 0, the estimate is a lower bound" for op in unpriced)
    busiest, classes = busiest_rank(graph.ranks, cost)  # a DLRM rank always has ops (its dense layers)
    classes[MEMORY_ALONGSIDE] = memory_alongside(ranks[busiest], classes[MEMORY], lookups, placement)
    return kernels, classes


def _step_overhead(params: dict, model: PerformanceModel, include_overhead: bool, problems: list[str]) -> float:
    """The fitted per-step CPU overhead for the step's `params` (0 without one, or when not
    included)."""
    step_overhead = model.step_overheads.get("dlrm") if include_overhead else None
    if step_overhead is None:
        return 0.0
    problems.extend(step_overhead.out_of_range(params))
    return step_overhead.predict(params)


def estimate_iteration(
    spec: JobSpec,
    table_to_rank: Sequence[PlanEntry],
    model: PerformanceModel,
    include_overhead: bool = True,
    simulate_graph: bool = True,
    placement: RankPlacement | None = None,
    memo: dict[tuple, Any] | None = None,
) -> CostBreakdown:
    """The iteration's kernels through the critical-path simulator over the job's execution
    graph (`simulate_graph`), or as the plain sum below (the baseline); plus the fitted
    per-step CPU overhead. `placement`: the node of every rank (default: one node); the job's
    collectives span all ranks, so it decides whether they run within a node or across nodes.
    `memo`: op prices kept across calls on the same model (`predictors.simulator.model_cost`)."""
    placement = placement or RankPlacement.single_node(spec.world_size)
    scope = placement.scope()
    problems: list[str] = []
    memo = memo if memo is not None else {}

    def predict(op: str, **params) -> float:
        key = ("isolated", op, frozen(params))
        if key not in memo:
            beyond = model.out_of_range(op, **params)  # first: an op without a model raises KeyError(op)
            memo[key] = (model.predict(op, **params), beyond)
        seconds, beyond = memo[key]
        problems.extend(beyond)
        return seconds

    shards = table_shards(spec, table_to_rank)
    emb_fwd, emb_bwd = _embedding_times(spec, shards, predict)
    dense = _dense_time(spec, predict)
    a2a = _exchange_time(spec, shards, scope, predict)
    allreduce = _all_reduce_time(spec, scope, predict)
    simulated, classes = _kernels(spec, table_to_rank, shards, placement, model, problems, memo, simulate_graph)
    kernels = (
        simulated if simulated is not None else max(f + b for f, b in zip(emb_fwd, emb_bwd)) + dense + a2a + allreduce
    )
    params = overhead_params(spec, kernels, table_to_rank, shards, classes)
    overhead = _step_overhead(params, model, include_overhead, problems)
    total = kernels + overhead
    return CostBreakdown(total, emb_fwd, emb_bwd, dense, a2a, allreduce, overhead, sorted(set(problems)), params)


def fit_overhead(
    model: PerformanceModel,
    step_rows: Sequence[Measurement],
    simulate_graph: bool = True,
    features: Sequence[str] = OVERHEAD_FEATURES,
) -> list[Measurement]:
    """Fit the step overhead (on `features`, a subset of `OVERHEAD_FEATURES` for a paired
    "before") on every training-probe row; score whole steps, each left out in turn
    (`opmodels.fit_step_overhead`).

    Sets `model.step_overheads["dlrm"]` and the `dlrm_step` metrics (whole-iteration error,
    with the kernels-only sum as the baseline). Returns the steps, judged held out.
    """
    kernels, residuals = step_residuals(model, step_rows, simulate_graph)
    fitted = fit_step_overhead(DLRM_OVERHEAD_OP, list(features), step_rows, kernels, residuals)
    model.step_overheads["dlrm"] = fitted.model
    baseline = score_steps(model, step_rows, include_overhead=False, simulate_graph=simulate_graph)
    model.metrics[DLRM_STEP_OP] = step_metrics(fitted, baseline)
    return list(step_rows)


def step_residuals(
    model: PerformanceModel, step_rows: Sequence[Measurement], simulate_graph: bool = True
) -> tuple[list[float], list[Measurement]]:
    """Each measured step's simulated kernels and what the step leaves over them (the rows the
    overhead is fitted on)."""
    kernels, residuals = [], []
    for row in step_rows:
        estimate = estimate_step(model, row, include_overhead=False, simulate_graph=simulate_graph)
        kernels.append(estimate.iteration_s)
        residuals.append(_residual(row, estimate))
    return kernels, residuals


def _residual(row: Measurement, kernels: CostBreakdown) -> Measurement:
    """A measured step's overhead: what it leaves over after its `kernels` (an estimate without
    the overhead; a step cannot cost less than its kernels: floored at 2% of the step)."""
    return Measurement(
        DLRM_OVERHEAD_OP,
        dict(kernels.overhead_params),
        max(row.median_s - kernels.iteration_s, 0.02 * row.median_s),
        0.0,
        row.repeats,
    )


def score_steps(
    model: PerformanceModel,
    step_rows: Sequence[Measurement],
    include_overhead: bool = True,
    simulate_graph: bool = True,
) -> ErrorStats:
    """Relative error of whole predicted training steps against measured `dlrm_step` rows."""
    errors = []
    for row in step_rows:
        predicted = estimate_step(model, row, include_overhead, simulate_graph).iteration_s
        errors.append(abs(predicted - row.median_s) / row.median_s)
    return error_stats(np.asarray(errors))


def estimate_step(
    model: PerformanceModel, row: Measurement, include_overhead: bool, simulate_graph: bool
) -> CostBreakdown:
    """The estimate of a measured `dlrm_step` row's job, plan and placement."""
    job = JobSpec.from_dict(row.params["job"])
    placement = placement_of(row.params, job.world_size)
    return estimate_iteration(job, row.params["table_to_rank"], model, include_overhead, simulate_graph, placement)

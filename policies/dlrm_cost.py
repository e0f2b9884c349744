"""Predicted iteration time of a table-wise sharded DLRM, from the per-op models.

INTERIM: until the critical-path simulator lands (its own issue), an iteration is costed as
a straight sum without overlap: the slowest rank's embedding forward + backward (the others
wait for it at the all-to-all), the dense MLP GEMMs (forward and both backward products per
layer), the forward and backward pooled-embedding all-to-all, the DDP gradient all-reduce per
bucket, and the CPU-side framework overhead of a step. That overhead is fitted from short
real training probes (`fit_overhead`): what their measured step time leaves over after the
kernel models, as a function of the number of dense layers and tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from predictors.evaluation import ErrorStats, error_stats, split_by_op
from predictors.opmodels import LinearCostModel
from predictors.performance_model import PerformanceModel
from probes.embedding import expected_features
from probes.gemm import gemm_params, linear_layer_gemms
from probes.jobspec import JobSpec
from probes.records import Measurement

DDP_FIRST_BUCKET_BYTES = 1 * 2**20
DDP_BUCKET_BYTES = 25 * 2**20
OVERHEAD_OP = "dlrm_overhead"
OVERHEAD_FEATURES = ["one", "dense_layers", "tables_total"]
STEP_OP = "dlrm_step"


@dataclass
class CostBreakdown:
    iteration_s: float
    embedding_fwd_s: list[float]  # per rank
    embedding_bwd_s: list[float]
    dense_s: float
    all_to_all_s: float  # forward + backward
    all_reduce_s: float
    overhead_s: float
    out_of_range: list[str]

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


def ddp_buckets(param_bytes: int) -> list[int]:
    """Bucket sizes DDP all-reduces: a small first bucket, then up to 25 MiB each."""
    buckets, left = [], param_bytes
    first = min(left, DDP_FIRST_BUCKET_BYTES)
    if first:
        buckets.append(first)
        left -= first
    while left > 0:
        buckets.append(min(left, DDP_BUCKET_BYTES))
        left -= buckets[-1]
    return buckets


def overhead_params(spec: JobSpec) -> dict:
    return {"dense_layers": len(spec.dense_layers()), "tables_total": len(spec.tables), "world": spec.world_size}


def estimate_iteration(
    spec: JobSpec, table_to_rank: Sequence[int], model: PerformanceModel, include_overhead: bool = True
) -> CostBreakdown:
    W, B = spec.world_size, spec.batch_size
    problems: list[str] = []

    def predict(op: str, **params) -> float:
        problems.extend(model.out_of_range(op, **params))
        return model.predict(op, **params)

    emb_fwd, emb_bwd = [], []
    for r in range(W):
        local = [spec.tables[i].shape for i, q in enumerate(table_to_rank) if q == r]
        if not local:
            emb_fwd.append(0.0)
            emb_bwd.append(0.0)
            continue
        feats = expected_features(local, B * W, seed=spec.seed)
        emb_fwd.append(predict("embedding_fwd", **feats))
        emb_bwd.append(predict("embedding_bwd", **feats))

    dense = 0.0
    for fan_in, fan_out in spec.dense_layers():
        for m, n, k in linear_layer_gemms(B, fan_in, fan_out):
            dense += predict("gemm", **gemm_params(m, n, k))

    # Pooled-embedding all-to-all: a rank sends W*B*width_r floats and receives B*sum(widths);
    # the message size of an uneven all-to-all is the largest per-rank send or receive.
    widths = [sum(spec.tables[i].embedding_dim for i, q in enumerate(table_to_rank) if q == r) for r in range(W)]
    a2a_bytes = 4 * max(max(W * B * w for w in widths), B * sum(widths))
    a2a = 2 * predict("all_to_all", bytes=a2a_bytes, world=W, scope="intra") if W > 1 else 0.0

    param_bytes = 4 * sum(i * o + o for i, o in spec.dense_layers())
    allreduce = sum(predict("all_reduce", bytes=b, world=W, scope="intra") for b in ddp_buckets(param_bytes)) if W > 1 else 0.0

    overhead = 0.0
    if include_overhead and OVERHEAD_OP in model.models:
        overhead = predict(OVERHEAD_OP, **overhead_params(spec))

    slowest = max(f + b for f, b in zip(emb_fwd, emb_bwd))
    total = slowest + dense + a2a + allreduce + overhead
    return CostBreakdown(total, emb_fwd, emb_bwd, dense, a2a, allreduce, overhead, sorted(set(problems)))


def fit_overhead(model: PerformanceModel, step_rows: Sequence[Measurement], seed: int = 0) -> list[Measurement]:
    """Fit the step overhead on a seeded split of training-probe rows; score whole steps.

    Adds `dlrm_overhead` to `model.models` and held-out `dlrm_step` metrics (whole-iteration
    error, with the kernels-only sum as the baseline). Returns the held-out step rows.
    """
    train, test = split_by_op(step_rows, seed)
    residuals = []
    for row in train:
        job = JobSpec.from_dict(row.params["job"])
        kernels = estimate_iteration(job, row.params["table_to_rank"], model, include_overhead=False).iteration_s
        # A step cannot cost less than its kernels; floor the residual at 2% of the step.
        residuals.append(Measurement(OVERHEAD_OP, overhead_params(job), max(row.median_s - kernels, 0.02 * row.median_s), 0.0, row.repeats))
    model.models[OVERHEAD_OP] = LinearCostModel(OVERHEAD_OP, OVERHEAD_FEATURES).fit(residuals)

    stats = score_steps(model, test).to_dict()
    stats["baseline_gmae"] = score_steps(model, test, include_overhead=False).gmae if test else None
    stats["n_train"] = len(train)
    model.metrics[STEP_OP] = stats
    return test


def score_steps(model: PerformanceModel, step_rows: Sequence[Measurement], include_overhead: bool = True) -> ErrorStats:
    """Relative error of whole predicted training steps against measured `dlrm_step` rows."""
    errors = []
    for row in step_rows:
        job = JobSpec.from_dict(row.params["job"])
        predicted = estimate_iteration(job, row.params["table_to_rank"], model, include_overhead).iteration_s
        errors.append(abs(predicted - row.median_s) / row.median_s)
    return error_stats(np.asarray(errors))

"""Build the per-rank `ExecutionGraph` of one table-wise sharded DLRM iteration from a job and
a plan, mirroring `probes/workloads/dlrm.py` op for op (no run needed).

Per rank, in issue order: TBE forward of the rank's tables; the pooled-embedding all-to-all
(uneven: the message is the largest per-rank send or receive); bottom MLP forward (addmm +
relu per layer); the concatenation (a copy); top MLP forward; then backward: top MLP (the
grad_input and grad_weight products, relu backward), the backward all-to-all, bottom MLP, the
TBE backward with its fused update; DDP gradient all-reduces on the communication stream as
buckets fill (a small first bucket, then `bucket_bytes`); the optimizer step.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from predictors.graph import ExecutionGraph, GraphOp
from probes.embedding import expected_features
from probes.elementwise import elementwise_params
from probes.gemm import gemm_params
from probes.memcpy import memcpy_params
from probes.jobspec import JobSpec

DDP_FIRST_BUCKET_BYTES = 1 * 2**20
DDP_BUCKET_BYTES = 25 * 2**20
FLOAT = 4


def ddp_buckets(param_bytes: int, bucket_bytes: int = DDP_BUCKET_BYTES) -> list[int]:
    """Bucket sizes DDP all-reduces: a small first bucket, then up to `bucket_bytes` each."""
    buckets, left = [], param_bytes
    first = min(left, DDP_FIRST_BUCKET_BYTES)
    if first:
        buckets.append(first)
        left -= first
    while left > 0:
        buckets.append(min(left, bucket_bytes))
        left -= buckets[-1]
    return buckets


def _pooled_widths(spec: JobSpec, table_to_rank: Sequence[int]) -> list[int]:
    return [sum(spec.tables[i].embedding_dim for i, q in enumerate(table_to_rank) if q == r)
            for r in range(spec.world_size)]


def all_to_all_bytes(spec: JobSpec, table_to_rank: Sequence[int]) -> int:
    """A rank sends W*B*width_r floats and receives B*sum(widths): the larger bounds the op."""
    W, B = spec.world_size, spec.batch_size
    widths = _pooled_widths(spec, table_to_rank)
    return FLOAT * max(max(W * B * w for w in widths), B * sum(widths))


def all_to_all_params(spec: JobSpec, table_to_rank: Sequence[int], scope: str) -> dict[str, Any]:
    """The pooled-embedding all-to-all: uneven (priced on the uneven curve) unless every rank
    holds the same pooled width."""
    params: dict[str, Any] = {"bytes": all_to_all_bytes(spec, table_to_rank), "world": spec.world_size, "scope": scope}
    if len(set(_pooled_widths(spec, table_to_rank))) > 1:
        params["uneven"] = True
    return params


class _RankBuilder:
    def __init__(self) -> None:
        self.ops: list[GraphOp] = []

    def add(self, op: GraphOp) -> int:
        self.ops.append(op)
        return len(self.ops) - 1


def build_dlrm_graph(
    spec: JobSpec,
    table_to_rank: Sequence[int],
    scope: str = "intra",
    bucket_bytes: int = DDP_BUCKET_BYTES,
    embedding_features: Callable[..., dict[str, Any]] = expected_features,
) -> ExecutionGraph:
    W, B = spec.world_size, spec.batch_size
    if len(table_to_rank) != len(spec.tables):
        raise ValueError(f"plan places {len(table_to_rank)} tables, job has {len(spec.tables)}")
    group = tuple(range(W))
    a2a = all_to_all_params(spec, table_to_rank, scope)
    layers = spec.dense_layers()
    n_bottom = len(spec.dense.bottom_mlp)
    bucket_sizes = ddp_buckets(FLOAT * sum(i * o + o for i, o in layers), bucket_bytes)
    emb_width = sum(t.embedding_dim for t in spec.tables)
    graph = []
    for r in range(W):
        g = _RankBuilder()
        local = [spec.tables[i].shape for i, q in enumerate(table_to_rank) if q == r]
        feats = embedding_features(local, B * W, seed=spec.seed) if local else None
        emb_fwd = g.add(GraphOp("embedding_fwd", "compute", "embedding_fwd", feats or {})) if local else None
        a2a_fwd = g.add(GraphOp("all_to_all_fwd", "collective", "all_to_all", a2a, "comm",
                                [emb_fwd] if emb_fwd is not None else [], group))
        prev = None
        for li, (fan_in, fan_out) in enumerate(layers):
            if li == n_bottom:  # interaction: concatenate bottom output with the exchanged embeddings
                cat = memcpy_params("d2d", FLOAT * B * fan_in)
                prev = g.add(GraphOp("interaction_cat", "memory", "memcpy", cat, deps=[a2a_fwd] + ([prev] if prev is not None else [])))
            prev = g.add(GraphOp(f"fc{li}_fwd", "compute", "gemm", gemm_params(B, fan_out, fan_in, variant="addmm"),
                                 deps=[prev] if prev is not None else []))
            if li != len(layers) - 1:
                prev = g.add(GraphOp(f"relu{li}_fwd", "compute", "relu", elementwise_params("relu", B, fan_out), deps=[prev]))
        # Backward, last layer first; gradients fill DDP buckets in that order.
        buckets = list(bucket_sizes)
        filled, reduces, a2a_bwd = 0.0, [], None
        for li in range(len(layers) - 1, -1, -1):
            fan_in, fan_out = layers[li]
            if li != len(layers) - 1:
                prev = g.add(GraphOp(f"relu{li}_bwd", "compute", "mul", elementwise_params("mul", B, fan_out), deps=[prev]))
            weight_grad = g.add(GraphOp(f"fc{li}_grad_weight", "compute", "gemm", gemm_params(fan_out, fan_in, B), deps=[prev]))
            if li > 0:
                prev = g.add(GraphOp(f"fc{li}_grad_input", "compute", "gemm", gemm_params(B, fan_in, fan_out), deps=[prev]))
            filled += FLOAT * (fan_in * fan_out + fan_out)
            while buckets and filled >= buckets[0] - 1e-9:
                filled -= buckets[0]
                ar = {"bytes": int(buckets.pop(0)), "world": W, "scope": scope}
                reduces.append(g.add(GraphOp(f"ddp_all_reduce{len(reduces)}", "collective", "all_reduce", ar, "comm",
                                             [weight_grad], group)))
            if li == n_bottom:  # the embeddings' gradient goes back through the all-to-all
                a2a_bwd = g.add(GraphOp("all_to_all_bwd", "collective", "all_to_all", a2a, "comm", [prev], group))
        if local:
            g.add(GraphOp("embedding_bwd", "compute", "embedding_bwd", feats or {}, deps=[a2a_bwd] if a2a_bwd is not None else []))
        params_numel = sum(i * o + o for i, o in layers)
        cols = 1024
        g.add(GraphOp("optimizer_step", "compute", "add", elementwise_params("add", -(-params_numel // cols), cols), deps=reduces))
        graph.append(g.ops)
    return ExecutionGraph(graph, meta={"job": spec.name, "workload": "dlrm", "table_to_rank": list(table_to_rank)})

"""Build the per-rank `ExecutionGraph` of one DLRM iteration from a job and a sharding plan,
mirroring `probes/workloads/dlrm.py` op for op for table-wise plans (no run needed); row-wise
tables add a reduce-scatter of partial pooled sums (an all-gather in backward), column-wise
tables are exchanged as narrower pieces, data-parallel tables are looked up locally and their
gradients all-reduced (`probes/vocabulary/table_shards.py`).

Per rank, in issue order: TBE forward of the rank's tables; the pooled-embedding all-to-all
(uneven: the message is the largest per-rank send or receive); the copies that lay the
received pieces side by side and join every embedding part (two concatenations); bottom MLP
forward (addmm + relu per layer); the interaction's concatenation (a copy); top MLP forward;
then backward: top MLP (the grad_input and grad_weight products, relu backward), bottom MLP,
with DDP gradient all-reduces on the communication stream as buckets fill (a small first
bucket, then `bucket_bytes`; each layer's gradients copied into their bucket first); then the
replicas' lookup backward, the copies that make the embeddings' gradient contiguous for its
collectives, the backward all-gather / all-to-all (queued behind DDP's all-reduces), the TBE
backward with its fused update; DDP's copies of the reduced buckets back into the gradients;
the optimizer step.

The concatenations and gradient copies are memcpy ops priced by the memcpy model, as a
profiled step shows them (`aten::cat`, `aten::clone`, `aten::copy_`): a traced 2-rank
batch-512 step spent 2.1 ms a rank in `aten::cat` where the graph had only the interaction's
(`benchmarks/step_breakdown.py`). The embeddings' grow with batch x pooled width, DDP's with
the dense parameters (DDP's default keeps gradients apart from its buckets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from predictors.ddp_buckets import DDP_BUCKET_BYTES, GRADIENT_REDUCE, BucketFill, ddp_buckets
from predictors.graph import ExecutionGraph, GraphOp
from probes.vocabulary.jobspec import JobSpec, TableShape
from probes.vocabulary.ops import elementwise_params, gemm_params, memcpy_params
from probes.vocabulary.placement import INTRA, PlacementError, RankPlacement
from probes.vocabulary.table_shards import (
    PlanEntry,
    TableShard,
    exchanged_widths,
    local_pieces,
    replicated_tables,
    row_wise_width,
    table_shards,
)
from probes.vocabulary.tbe_features import expected_features

FLOAT = 4


def dense_parameter_bytes(spec: JobSpec) -> int:
    """float32 bytes of the bottom and top MLPs' weights and biases: what DDP all-reduces."""
    return FLOAT * sum(i * o + o for i, o in spec.dense_layers())


def _all_to_all(spec: JobSpec, widths: Sequence[int], scope: str) -> dict[str, Any]:
    """A rank sends W*B*width_r floats and receives B*sum(widths): the larger bounds the op;
    uneven (priced on the uneven curve) unless every rank sends the same width."""
    W, B = spec.world_size, spec.batch_size
    params: dict[str, Any] = {
        "bytes": FLOAT * max(max(W * B * w for w in widths), B * sum(widths)),
        "world": W,
        "scope": scope,
    }
    if len(set(widths)) > 1:
        params["uneven"] = True
    return params


def all_to_all_params(spec: JobSpec, plan: Sequence[PlanEntry], scope: str = INTRA) -> dict[str, Any]:
    """The pooled-embedding all-to-all of a plan (its table- and column-wise pieces)."""
    return shards_all_to_all_params(spec, table_shards(spec, plan), scope)


def shards_all_to_all_params(spec: JobSpec, shards: Sequence[TableShard], scope: str = INTRA) -> dict[str, Any]:
    """`all_to_all_params` from the plan's pieces."""
    return _all_to_all(spec, exchanged_widths(spec, shards), scope)


def all_to_all_bytes(spec: JobSpec, plan: Sequence[PlanEntry]) -> int:
    return all_to_all_shards_bytes(spec, table_shards(spec, plan))


def all_to_all_shards_bytes(spec: JobSpec, shards: Sequence[TableShard]) -> int:
    return int(shards_all_to_all_params(spec, shards)["bytes"])


class _RankBuilder:
    def __init__(self) -> None:
        self.ops: list[GraphOp] = []

    def add(self, op: GraphOp) -> int:
        self.ops.append(op)
        return len(self.ops) - 1


@dataclass
class _Layout:
    """What every rank's ops of one DLRM iteration share: the plan's shards, the collectives'
    params, the dense layers and DDP's buckets."""

    spec: JobSpec
    scope: str
    shards: list[TableShard]
    local: list[list[TableShape]]  # per rank, its own (not replicated) pieces, in plan order
    group: tuple[int, ...]
    a2a: dict[str, Any] | None  # the pooled-embedding all-to-all (None: no table- or column-wise piece)
    rw_width: int
    rw_bytes: int  # the partial pooled sums of the global batch
    exchanged_width: int  # summed width of the table- and column-wise pieces every rank receives
    dp_tables: list[TableShape]
    dp_width: int
    dp_grad_bytes: int
    layers: list[tuple[int, int]]
    n_bottom: int
    bucket_sizes: list[int]
    embedding_features: Callable[..., dict[str, Any]]


def build_dlrm_graph(
    spec: JobSpec,
    plan: Sequence[PlanEntry],
    placement: RankPlacement | None = None,
    bucket_bytes: int = DDP_BUCKET_BYTES,
    embedding_features: Callable[..., dict[str, Any]] = expected_features,
    shards: Sequence[TableShard] | None = None,
    ranks: Sequence[int] | None = None,
) -> ExecutionGraph:
    """`plan`: per table a rank (table-wise) or a row-/column-wise / data-parallel entry
    (`probes.vocabulary.table_shards`). `placement`: the node of every rank (default: all on one node);
    every DLRM collective spans the whole world, so it is priced on the curve of a group that
    size within one node or across nodes, as the ranks are placed. `shards`: the plan's pieces
    when the caller has listed them already (`table_shards(spec, plan)`). `ranks`: build only
    these ranks (renumbered in order; every collective still priced as the whole world's),
    for a simulation that needs no others (`predictors.dlrm_ranks.dominant_ranks`)."""
    W, B = spec.world_size, spec.batch_size
    placement = placement or RankPlacement.single_node(W)
    if placement.world != W:
        raise PlacementError(f"placement: {placement.world} ranks placed, the job has world_size={W}")
    scope = placement.scope()
    shards = list(shards) if shards is not None else table_shards(spec, plan)
    widths = exchanged_widths(spec, shards)
    rw_width = row_wise_width(shards)
    dp_tables = replicated_tables(shards)
    x = _Layout(
        spec,
        scope,
        shards,
        local_pieces(shards, W),
        tuple(range(W if ranks is None else len(ranks))),
        _all_to_all(spec, widths, scope) if sum(widths) else None,
        rw_width,
        FLOAT * B * W * rw_width,
        sum(widths),
        dp_tables,
        sum(t.embedding_dim for t in dp_tables),
        FLOAT * sum(t.num_embeddings * t.embedding_dim for t in dp_tables),
        spec.dense_layers(),
        len(spec.dense.bottom_mlp),
        ddp_buckets(dense_parameter_bytes(spec), bucket_bytes),
        embedding_features,
    )
    graph = [_rank_ops(x, r) for r in (range(W) if ranks is None else ranks)]
    return ExecutionGraph(graph, meta=_graph_meta(spec, plan, placement, ranks, x.a2a is not None))


def _graph_meta(
    spec: JobSpec, plan: Sequence[PlanEntry], placement: RankPlacement, ranks: Sequence[int] | None, a2a: bool
) -> dict[str, Any]:
    """What the graph stands for: the job, its plan and placement, the ranks built (when not
    all), and the lookup + all-to-all pair an overlap may substitute (when tables are sharded)."""
    meta: dict[str, Any] = {
        "job": spec.name,
        "workload": "dlrm",
        "table_to_rank": [p if isinstance(p, dict) else int(p) for p in plan],
        "placement": placement.to_dict(),
    }
    if ranks is not None:
        meta["ranks"] = list(ranks)
    if a2a:  # the lookup and the all-to-all that ships its pooled rows (predictors/overlap_model.py)
        meta["substitutable"] = [
            {
                "name": "embedding_all_to_all",
                "pair": "embedding_all_to_all",
                "producer": "embedding_fwd",
                "collective": "all_to_all_fwd",
                "sliced_with": ["embedding_bwd"],
            }
        ]
    return meta


def _rank_ops(x: _Layout, r: int) -> list[GraphOp]:
    """Rank `r`'s iteration in issue order."""
    spec, W, B = x.spec, x.spec.world_size, x.spec.batch_size
    g = _RankBuilder()
    local = x.local[r]
    feats = x.embedding_features(local, B * W, seed=spec.seed) if local else None
    emb_fwd = g.add(GraphOp("embedding_fwd", "compute", "embedding_fwd", feats or {})) if local else None
    sent = [emb_fwd] if emb_fwd is not None else []
    exchanged = []
    if x.a2a is not None:
        exchanged.append(g.add(GraphOp("all_to_all_fwd", "collective", "all_to_all", x.a2a, "comm", sent, x.group)))
    if x.rw_width:
        rs = {"bytes": x.rw_bytes, "world": W, "scope": x.scope}
        exchanged.append(
            g.add(GraphOp("reduce_scatter_fwd", "collective", "reduce_scatter", rs, "comm", sent, x.group))
        )
    if x.a2a is not None:  # the received pieces laid side by side: [B, exchanged width]
        exchanged[0] = _copy(g, "exchange_cat", FLOAT * B * x.exchanged_width, [exchanged[0]])
    dp_feats = x.embedding_features(x.dp_tables, B, seed=spec.seed) if x.dp_tables else None
    if dp_feats is not None:  # replicas: the local batch only, nothing to exchange
        exchanged.append(g.add(GraphOp("embedding_dp_fwd", "compute", "embedding_fwd", dp_feats)))
    if exchanged:  # every part joined into the [B, all widths] embeddings
        width = x.exchanged_width + x.rw_width + x.dp_width
        exchanged = [_copy(g, "embeddings_cat", FLOAT * B * width, exchanged)]
    prev = _dense_forward(g, x, exchanged)
    reduces, concat_grad = _dense_backward(g, x, prev)
    dp_bwd = None
    if dp_feats is not None:  # the replicas' lookup was made last: autograd reaches it first
        # the lookup's backward takes its slice of the concatenation's gradient contiguous
        deps = [concat_grad] if concat_grad is not None else []
        grad = _copy(g, "embedding_dp_grad_copy", FLOAT * B * x.dp_width, deps)
        dp_bwd = g.add(GraphOp("embedding_dp_bwd", "compute", "embedding_bwd", dp_feats, deps=[grad]))
    returned = _return_embedding_grads(g, x, concat_grad)
    if local:
        g.add(GraphOp("embedding_bwd", "compute", "embedding_bwd", feats or {}, deps=returned))
    # once the backward is done DDP copies each reduced bucket back into the gradients
    reduced = [_copy(g, f"ddp_grad_copy{i}", size, [ar]) for i, (ar, size) in enumerate(zip(reduces, x.bucket_sizes))]
    if dp_bwd is not None:  # their gradients all-reduced once the backward is done
        ar = {"bytes": x.dp_grad_bytes, "world": W, "scope": x.scope}
        reduced.append(g.add(GraphOp("dp_table_all_reduce", "collective", "all_reduce", ar, "comm", [dp_bwd], x.group)))
    params_numel = sum(i * o + o for i, o in x.layers)
    cols = 1024
    g.add(
        GraphOp(
            "optimizer_step", "compute", "add", elementwise_params("add", -(-params_numel // cols), cols), deps=reduced
        )
    )
    return g.ops


def _copy(g: _RankBuilder, name: str, nbytes: int, deps: list[int]) -> int:
    """A device-to-device copy of `nbytes` (a concatenation or a contiguous gradient)."""
    return g.add(GraphOp(name, "memory", "memcpy", memcpy_params("d2d", nbytes), deps=deps))


def _dense_forward(g: _RankBuilder, x: _Layout, exchanged: list[int]) -> int:
    """The bottom MLP, the interaction (a concatenation with the exchanged embeddings), the top
    MLP; returns the last op."""
    B, layers = x.spec.batch_size, x.layers
    prev: int | None = None
    for li, (fan_in, fan_out) in enumerate(layers):
        if li == x.n_bottom:  # interaction: concatenate bottom output with the exchanged embeddings
            cat = memcpy_params("d2d", FLOAT * B * fan_in)
            prev = g.add(
                GraphOp(
                    "interaction_cat", "memory", "memcpy", cat, deps=exchanged + ([prev] if prev is not None else [])
                )
            )
        prev = g.add(
            GraphOp(
                f"fc{li}_fwd",
                "compute",
                "gemm",
                gemm_params(B, fan_out, fan_in, variant="addmm"),
                deps=[prev] if prev is not None else [],
            )
        )
        if li != len(layers) - 1:
            prev = g.add(
                GraphOp(f"relu{li}_fwd", "compute", "relu", elementwise_params("relu", B, fan_out), deps=[prev])
            )
    if prev is None:
        raise ValueError("a DLRM has at least one dense layer")  # the job spec refuses one without
    return prev


def _dense_backward(g: _RankBuilder, x: _Layout, prev: int) -> tuple[list[int], int | None]:
    """Backward, last layer first, the bottom MLP included; gradients fill DDP buckets in that
    order. Returns the DDP all-reduces and the concatenation's gradient (the embeddings' share
    goes back after the bottom MLP: `_return_embedding_grads`)."""
    B, layers = x.spec.batch_size, x.layers
    buckets = BucketFill(x.bucket_sizes)
    reduces: list[int] = []
    concat_grad = None
    for li in range(len(layers) - 1, -1, -1):
        fan_in, fan_out = layers[li]
        if li != len(layers) - 1:
            prev = g.add(GraphOp(f"relu{li}_bwd", "compute", "mul", elementwise_params("mul", B, fan_out), deps=[prev]))
        weight_grad = g.add(
            GraphOp(f"fc{li}_grad_weight", "compute", "gemm", gemm_params(fan_out, fan_in, B), deps=[prev])
        )
        if li > 0:
            prev = g.add(GraphOp(f"fc{li}_grad_input", "compute", "gemm", gemm_params(B, fan_in, fan_out), deps=[prev]))
        # DDP copies the layer's gradients into their bucket as they are written
        grad_bytes = FLOAT * (fan_in * fan_out + fan_out)
        filled = _copy(g, f"fc{li}_bucket_copy", grad_bytes, [weight_grad])
        for size in buckets.add(grad_bytes):
            ar = {"bytes": size, "world": x.spec.world_size, "scope": x.scope}
            reduces.append(
                g.add(
                    GraphOp(
                        f"{GRADIENT_REDUCE}{len(reduces)}", "collective", "all_reduce", ar, "comm", [filled], x.group
                    )
                )
            )
        if li == x.n_bottom:
            concat_grad = prev
    return reduces, concat_grad


def _return_embedding_grads(g: _RankBuilder, x: _Layout, concat_grad: int | None) -> list[int]:
    """The collectives returning the embeddings' gradient, in the order autograd reaches them:
    the pooled embeddings were made before the bottom MLP ran, so their backward comes after
    the bottom MLP's (autograd runs the latest-made ready node first), and the row-wise
    all-gather (made after the all-to-all) before the all-to-all. On the communication stream
    they queue behind the DDP all-reduces already issued: a traced 2-rank gloo step issued its
    backward all-to-all after both DDP buckets and ran it once they were done.

    Each is sent from a contiguous copy of its slice of the concatenation's gradient; the
    all-to-all's takes two (each received piece's gradient made contiguous, then the pieces
    joined back in receive order)."""
    B = x.spec.batch_size
    deps = [concat_grad] if concat_grad is not None else []
    returned: list[int] = []
    if x.rw_width:
        ag = {"bytes": x.rw_bytes, "world": x.spec.world_size, "scope": x.scope}
        grad = _copy(g, "row_wise_grad_copy", FLOAT * B * x.rw_width, deps)
        returned.append(g.add(GraphOp("all_gather_bwd", "collective", "all_gather", ag, "comm", [grad], x.group)))
    if x.a2a is not None:
        pieces = _copy(g, "exchange_grad_copy", FLOAT * B * x.exchanged_width, deps)
        grad = _copy(g, "exchange_grad_cat", FLOAT * B * x.exchanged_width, [pieces])
        returned.append(g.add(GraphOp("all_to_all_bwd", "collective", "all_to_all", x.a2a, "comm", [grad], x.group)))
    return returned


def dlrm_slice_params(
    spec: JobSpec, plan: Sequence[PlanEntry], embedding_features: Callable[..., dict[str, Any]] = expected_features
):
    """Params of one of k slices of a rank's lookup (forward or backward): its tables for
    1/k of the global batch's bags, as the overlapped exchange looks them up."""
    local = local_pieces(table_shards(spec, plan), spec.world_size)
    bags = spec.batch_size * spec.world_size

    def params(rank: int, op: GraphOp, slices: int) -> dict[str, Any]:
        return embedding_features(local[rank], max(1, -(-bags // slices)), seed=spec.seed)

    return params

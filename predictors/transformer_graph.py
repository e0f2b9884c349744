"""Build the per-rank `ExecutionGraph` of one training iteration of a GPT-style block stack
under its layout (`TransformerSpec`), mirroring `probes/workloads/transformer.py` op for op (no
run needed).

Each rank runs its pipeline stage's micro-batches in 1F1B order (one stage: forward and backward
of each in turn, gradient accumulation). A micro-batch's forward receives the previous stage's
activations (a two-rank transfer, priced as a broadcast; the sender's is posted, as isend is),
runs the embedding on the first stage, the stage's blocks (predictors/transformer_block_graph.py)
and on the last stage the final layer norm and the loss (MSE, or an LM head and cross-entropy),
then sends its output on; the backward mirrors it, with each block's forward replayed first
under recomputation. Data-parallel gradients are reduced once, in the last micro-batch: DDP's
bucket all-reduces as gradients fill them; FSDP's reduce-scatters per block (its parameters
all-gathered before each block's forward, prefetched one block ahead, and again before its
backward under full_shard); with a pipeline, the stage's buckets all-reduced after its last
backward. Then SGD over the rank's parameters (its shard under FSDP).

The copies around FSDP's and a pipeline's reductions are listed
(predictors/data_parallel_graph.py); DDP's reducer copies are not (`DdpBuckets`).
"""

from __future__ import annotations

from predictors.data_parallel_graph import FLAT_COLS, bucket_all_reduce, fsdp_gather, fsdp_reduce_scatter, fsdp_unshard
from predictors.ddp_buckets import DDP_BUCKET_BYTES, BucketFill, ddp_buckets
from predictors.dlrm_graph import FLOAT
from predictors.graph import ExecutionGraph, GraphOp
from predictors.transformer_block_graph import (
    BlockSizes,
    DdpBuckets,
    RankOps,
    block_backward,
    block_forward,
    block_param_numel,
    linear_backward,
)
from probes.vocabulary.ops import elementwise_params, memcpy_params
from probes.vocabulary.placement import PlacementError, RankPlacement
from probes.vocabulary.transformer_spec import TransformerSpec

__all__ = ["block_param_numel", "build_transformer_graph", "is_transfer", "one_f_one_b", "stage_param_numel"]

# The names of a micro-batch's transfers between adjacent pipeline stages.
TRANSFERS = ("recv_activations", "send_activations", "recv_gradients", "send_gradients")


def is_transfer(op: GraphOp) -> bool:
    """Whether `op` is a pipeline stage's send or receive (not a group collective)."""
    return op.kind == "collective" and op.name.rsplit(".", 1)[-1] in TRANSFERS


def stage_param_numel(spec: TransformerSpec, stage: int) -> int:
    """Parameters one rank of pipeline stage `stage` holds (its TP shard of its blocks; the
    embedding on the first stage, the final layer norm and LM head on the last)."""
    numel = block_param_numel(spec) * len(spec.stage_layers(stage))
    vocab = spec.vocab_size * spec.hidden
    if stage == 0:
        numel += vocab
    if stage == spec.pipeline_parallel - 1:
        numel += 2 * spec.hidden + vocab
    return numel


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage `stage`'s order of micro-batch forwards ("F", i) and backwards ("B", i) under the
    1F1B schedule: as many warm-up forwards as stages after it, then one forward and one
    backward in turn, then the remaining backwards. One stage: forward then backward of each
    micro-batch (gradient accumulation)."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
    return order


def build_transformer_graph(
    spec: TransformerSpec,
    placement: RankPlacement | None = None,
    bucket_bytes: int = DDP_BUCKET_BYTES,
    fold: bool = False,
) -> ExecutionGraph:
    """`placement`: the node of every rank (default: one node); each TP, DP and pipeline
    group's collectives are priced on the curve of their own scope. `fold`: build only
    the ranks that stand for the others when their ops are alike (`stage_representatives`:
    one rank without a pipeline, one data-parallel replica with one), which simulates to the
    same iteration as the whole world (a 1,024-rank data-parallel layout as one rank);
    `meta["folded"]` then names the ranks it stands for."""
    placement = placement or RankPlacement.single_node(spec.world_size)
    if placement.world != spec.world_size:
        raise PlacementError(f"placement: {placement.world} ranks placed, the job has world_size={spec.world_size}")
    representatives = stage_representatives(spec, placement) if fold else None
    if representatives is None:
        ranks = [_Iteration(spec, r, placement, bucket_bytes).ops() for r in range(spec.world_size)]
    else:
        ranks = _folded(spec, placement, bucket_bytes, representatives)
    meta = {
        "job": spec.name,
        "workload": "transformer",
        "layout": spec.layout,
        "tensor_parallel": spec.tensor_parallel,
        "data_parallel": spec.data_parallel,
        "pipeline_parallel": spec.pipeline_parallel,
        "placement": placement.to_dict(),
    }
    if representatives is not None:
        meta["folded"] = {"ranks": list(representatives), "world_size": spec.world_size}
    plain = spec.pipeline_parallel == 1 and spec.micro_batches == 1 and not spec.recompute
    if spec.tensor_parallel > 1 and plain:
        # each row-parallel product and the all-reduce of its partial sums (predictors/overlap_model.py);
        # the real job overlaps them in the plain layout only (one forward of each block a step)
        meta["substitutable"] = [
            {
                "name": f"b{layer}.{linear}",
                "pair": "gemm_all_reduce",
                "producer": f"b{layer}.{linear}",
                "collective": f"b{layer}.{linear}_all_reduce",
            }
            for layer in range(spec.layers)
            for linear in ("out", "fc2")
        ]
    return ExecutionGraph(ranks, meta=meta)


def stage_representatives(spec: TransformerSpec, placement: RankPlacement) -> tuple[int, ...] | None:
    """The ranks that stand for every rank, when each rank has a representative with its
    TP-group, DP-group and pipeline-neighbour scopes (so it issues the same ops at the same
    prices and, its group members being alike, meets them at the same times): without a
    pipeline one rank (rank 0); with a pipeline the whole first data-parallel
    replica (every stage's TP group). None when some rank differs (a placement that splits
    groups unevenly over nodes), and the whole world must be simulated.

    A pipeline keeps its TP groups whole: the simulator places a posted send when its
    receiver arrives, and where the sender's link is shared with its TP collectives the order
    in which ranks are advanced moves the result, so one rank per stage did not simulate to
    the whole world's iteration (up to 48% apart in an uncommitted check); the replicas are
    alike, and folding them is exact (tests/test_planning_scale.py)."""
    scopes: dict[tuple[int, ...], str] = {}

    def scope(group: tuple[int, ...]) -> str:
        if group not in scopes:
            scopes[group] = placement.scope(group)
        return scopes[group]

    def signature(r: int) -> tuple:
        stage, pipeline = spec.stage_of(r), spec.pp_group_of(r)
        return (
            scope(spec.tp_group_of(r)),
            scope(spec.dp_group_of(r)),
            scope(pipeline[stage - 1 : stage + 1]) if stage > 0 else "",
            scope(pipeline[stage : stage + 2]) if stage < spec.pipeline_parallel - 1 else "",
        )

    piped = spec.pipeline_parallel > 1

    def representative(r: int) -> int:
        return spec.stage_of(r) * spec.stage_width + (r % spec.tensor_parallel if piped else 0)

    representatives = sorted({representative(r) for r in range(spec.world_size)})
    expected = {r: signature(r) for r in representatives}
    if any(signature(r) != expected[representative(r)] for r in range(spec.world_size)):
        return None
    return tuple(representatives)


def _folded(
    spec: TransformerSpec, placement: RankPlacement, bucket_bytes: int, representatives: tuple[int, ...]
) -> list[list[GraphOp]]:
    """The representatives' ops, renumbered from 0: a collective's group keeps only its
    representatives (its other members, alike, would arrive at the same time), its params
    still the whole group's size and scope, so it is priced as the whole group."""
    index = {r: i for i, r in enumerate(representatives)}
    ranks = []
    for r in representatives:
        ops = _Iteration(spec, r, placement, bucket_bytes).ops()
        for op in ops:
            if op.group:
                op.group = tuple(index[m] for m in op.group if m in index)
        ranks.append(ops)
    return ranks


class _Iteration:
    """Rank `r`'s iteration: its stage's micro-batches forward and backward in schedule order
    (receiving and sending activations and gradients between stages), the data-parallel
    gradient reduction, then SGD."""

    def __init__(self, spec: TransformerSpec, r: int, placement: RankPlacement, bucket_bytes: int) -> None:
        self.spec, self.r, self.placement = spec, r, placement
        self.g, self.x = RankOps(spec, r, placement), BlockSizes.of(spec)
        self.stage = spec.stage_of(r)
        self.first, self.last = self.stage == 0, self.stage == spec.pipeline_parallel - 1
        self.layers = spec.stage_layers(self.stage)
        self.numel = stage_param_numel(spec, self.stage)
        self.sharded = spec.fsdp != "none" and spec.data_parallel > 1
        ddp = spec.data_parallel > 1 and not self.sharded and spec.pipeline_parallel == 1
        buckets = ddp_buckets(FLOAT * self.numel, bucket_bytes) if ddp else []
        self.ddp = DdpBuckets(self.g, BucketFill(buckets))
        self.bucket_bytes = bucket_bytes
        pipeline = spec.pp_group_of(r)
        self.prev = pipeline[self.stage - 1] if not self.first else None
        self.next = pipeline[self.stage + 1] if not self.last else None

    def ops(self) -> list[GraphOp]:
        spec, g = self.spec, self.g
        m = spec.micro_batches
        for kind, i in one_f_one_b(spec.pipeline_parallel, self.stage, m):
            prefix = f"mb{i}." if m > 1 else ""
            if kind == "F":
                self.forward(prefix)
            else:
                self.ddp.active = i == m - 1
                self.backward(prefix, sync=i == m - 1)
        if spec.pipeline_parallel > 1 and spec.data_parallel > 1:
            self.pipeline_gradient_all_reduce()
        numel = -(-self.numel // spec.data_parallel) if self.sharded else self.numel
        g.add(
            "optimizer_step",
            "compute",
            "add",
            elementwise_params("add", -(-numel // FLAT_COLS), FLAT_COLS),
            tuple(self.ddp.reduces),
        )
        return g.ops

    # -- pipeline transfers and sharded data parallel -----------------------------------
    def p2p(self, name: str, source: int, target: int) -> None:
        """A micro-batch's activations (or their gradient) between adjacent stages: float32
        [tokens, hidden], priced as a two-rank broadcast; the sender's is posted (isend)."""
        g = self.g
        nbytes = FLOAT * self.x.T * self.x.H
        params = {"bytes": nbytes, "world": 2, "scope": self.placement.scope((source, target))}
        sending = source == self.r
        g.add(
            name,
            "collective",
            "broadcast",
            params,
            stream="comm:send" if sending else "comm",
            group=(source, target),
            chain=not sending,
        )
        if sending:
            g.ops[-1].posted = True

    def gather(self, name: str, numel: int) -> int | None:
        return fsdp_gather(self.g, name, numel) if self.sharded and numel else None

    def reduce_scatter(self, name: str, numel: int, after: int | None) -> None:
        if numel:
            self.ddp.reduces.append(fsdp_reduce_scatter(self.g, name, numel, after))

    def pipeline_gradient_all_reduce(self) -> None:
        self.ddp.reduces += bucket_all_reduce(self.g, FLOAT * self.numel, self.bucket_bytes)

    # -- one micro-batch ------------------------------------------------------------------
    def root_numel(self) -> int:
        """The parameters outside the blocks (FSDP's root unit)."""
        return self.numel - block_param_numel(self.spec) * len(self.layers)

    def forward(self, p: str) -> None:
        spec, g, x = self.spec, self.g, self.x
        root = self.root_numel()
        gathered = fsdp_unshard(g, p + "root_copy_out", self.gather(p + "root_all_gather", root), root)
        if self.prev is not None:
            self.p2p(p + "recv_activations", self.prev, self.r)
        if self.first and spec.vocab_size:
            g.add(p + "embedding", "memory", "memcpy", memcpy_params("d2d", FLOAT * x.T * x.H), (gathered,))
        waits: dict[int, int | None] = {}
        for k, layer in enumerate(self.layers):
            if k == 0:
                waits[layer] = self.gather(f"{p}b{layer}.all_gather", block_param_numel(spec))
            if k + 1 < len(self.layers):  # FSDP prefetches the next block's parameters
                following = self.layers[k + 1]
                waits[following] = self.gather(f"{p}b{following}.all_gather", block_param_numel(spec))
            ready = fsdp_unshard(g, f"{p}b{layer}.copy_out", waits[layer], block_param_numel(spec))
            block_forward(g, x, f"{p}b{layer}.", ready)
        if self.last:
            g.add(p + "ln_f", "compute", "layer_norm", elementwise_params("layer_norm", x.T, x.H), (gathered,))
            if spec.vocab_size:
                g.linear_forward(p + "head", x.T, spec.vocab_size, x.H, "mm", bias=False, float32_input=True)
                g.cast(p + "logits_cast", x.T * spec.vocab_size)
                g.elementwise(p + "cross_entropy", "softmax", x.T, spec.vocab_size)
            else:
                g.elementwise(p + "mse_loss", "mul", x.T, x.H)
        if self.next is not None:
            self.p2p(p + "send_activations", self.r, self.next)

    def backward(self, p: str, sync: bool) -> None:
        """`sync`: the micro-batch whose backward reduces the gradients (DDP's buckets, FSDP's
        reduce-scatters); the others only accumulate."""
        spec, g, x = self.spec, self.g, self.x
        if self.next is not None:
            self.p2p(p + "recv_gradients", self.next, self.r)
        # full_shard resharded every unit after forward, the root too: FSDP2 gathers the root
        # again (the loss's backward waits for it here; in the step it would overlap it) and
        # prefetches each next block's gather (backward order) before the reduce-scatter of
        # the block before it (traced under torch 2.13)
        regather = spec.fsdp == "full_shard"
        root = self.gather(p + "root_all_gather_bwd", self.root_numel()) if regather else None
        order = list(reversed(self.layers))
        waits = (
            {order[0]: self.gather(f"{p}b{order[0]}.all_gather_bwd", block_param_numel(spec))}
            if regather and order
            else {}
        )
        root = fsdp_unshard(g, p + "root_copy_out_bwd", root, self.root_numel())
        if self.last:
            if spec.vocab_size:
                g.elementwise(p + "cross_entropy_bwd", "softmax_bwd", x.T, spec.vocab_size, extra_deps=(root,))
                g.cast(p + "logits_grad_cast", x.T * spec.vocab_size)
                linear_backward(g, x, self.ddp, p + "head", x.H, spec.vocab_size, float32_input=True)
            else:
                g.elementwise(p + "mse_loss_bwd", "mul", x.T, x.H, extra_deps=(root,))
            g.elementwise(p + "ln_f_bwd", "layer_norm_bwd", x.T, x.H)
            self.ddp.gradients_ready(FLOAT * 2 * x.H, g.prev)
        for k, layer in enumerate(order):
            name = f"{p}b{layer}."
            waited = fsdp_unshard(g, name + "copy_out_bwd", waits.get(layer), block_param_numel(spec))
            if regather and k + 1 < len(order):  # after this unit's copy-out, as FSDP2's pre-backward
                waits[order[k + 1]] = self.gather(f"{p}b{order[k + 1]}.all_gather_bwd", block_param_numel(spec))
            if spec.recompute:
                block_forward(g, x, "recompute." + name, waited)
                waited = None
            block_backward(g, x, self.ddp, name, waited)
            if self.sharded and sync:
                self.reduce_scatter(name + "reduce_scatter", block_param_numel(spec), g.prev)
        if self.first and spec.vocab_size:
            g.add(p + "embedding_grad_zero", "memory", "memcpy", memcpy_params("d2d", FLOAT * spec.vocab_size * x.H))
            g.elementwise(p + "embedding_bwd", "add", x.T, x.H)
            self.ddp.gradients_ready(FLOAT * spec.vocab_size * x.H, g.prev)
        if self.sharded and sync:
            self.reduce_scatter(p + "root_reduce_scatter", self.root_numel(), g.prev)
        if self.prev is not None:
            self.p2p(p + "send_gradients", self.r, self.prev)

"""Build the per-rank `ExecutionGraph` of one GPT-style block-stack iteration from a
`TransformerSpec`, mirroring `probes/workloads/transformer.py` op for op (no run needed).

Per block, forward: layer_norm; QKV projection (column-parallel under TP); the head permute
(a copy); the q scaling (mul); q·kᵀ and ·v as batched GEMMs over local heads; softmax and
dropout on the scores; the context permute back (a copy); output projection (row-parallel:
all-reduce over the TP group, then the bias); dropout + residual; the MLP the same way with
gelu. Backward in reverse with each linear's grad_input and grad_weight products, the aten
backward kernels of layer_norm / softmax / gelu, masked multiplies for dropout, the TP
all-reduce of the column-parallel inputs' gradients, and DDP bucket all-reduces over the
data-parallel group on the communication stream as gradients fill buckets. Then SGD.

A bfloat16 / float16 spec trains under autocast (weights, gradients and SGD in float32): every
product runs in the reduced dtype, with the casts autocast adds (each linear's weight, and its
input where that is float32, forward; weight and input gradients back to float32, backward);
element-wise ops are priced in the dtype they see: layer norms, residual adds and the loss in
float32 (the residual stream stays float32), softmax, gelu, the attention scaling and dropout on
reduced-precision outputs in the reduced dtype (CPU autocast's choice; CUDA's runs softmax in
float32), and the permutes and the row-parallel all-reduces move reduced-precision elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from predictors.dlrm_graph import DDP_BUCKET_BYTES, FLOAT, BucketFill, ddp_buckets
from predictors.graph import ExecutionGraph, GraphOp
from probes.vocabulary.ops import element_bytes, elementwise_params, gemm_params, memcpy_params
from probes.vocabulary.placement import PlacementError, RankPlacement
from probes.vocabulary.transformer_spec import TransformerSpec


def block_param_numel(spec: TransformerSpec) -> int:
    """Parameters of one block on one rank (TP shards the four linear layers)."""
    H, local = spec.hidden, spec.hidden // spec.tensor_parallel
    linears = (H * 3 * local + 3 * local) + (local * H + H) + (H * 4 * local + 4 * local) + (4 * local * H + H)
    return linears + 4 * H  # two layer norms


class _Rank:
    def __init__(self, spec: TransformerSpec, rank: int, placement: RankPlacement):
        self.ops: list[GraphOp] = []
        self.spec = spec
        self.tp_group, self.dp_group = spec.tp_group_of(rank), spec.dp_group_of(rank)
        # consecutive ranks form a TP group, so TP stays on a node unless it outgrows one
        self.tp_scope, self.dp_scope = placement.scope(self.tp_group), placement.scope(self.dp_group)
        self.prev: int | None = None
        self.dtype = spec.dtype  # of the products and of the ops on their outputs (`low`)
        self.mixed = spec.dtype != "float32"
        self.low_size = element_bytes(spec.dtype)

    def add(
        self,
        name: str,
        kind: str,
        op: str,
        params: dict[str, Any],
        extra_deps: tuple[int | None, ...] = (),
        stream: str = "compute",
        group: tuple[int, ...] = (),
        chain: bool = True,
    ) -> int:
        deps = ([self.prev] if self.prev is not None else []) + [d for d in extra_deps if d is not None]
        self.ops.append(GraphOp(name, kind, op, params, stream, sorted(set(deps)), group))
        index = len(self.ops) - 1
        if chain:
            self.prev = index
        return index

    def elementwise(self, name: str, op: str, rows: int, cols: int, low: bool = False) -> int:
        """`low`: the op sees the products' reduced-precision outputs (else float32)."""
        return self.add(name, "compute", op, elementwise_params(op, rows, cols, self.dtype if low else "float32"))

    def gemm(self, name: str, m: int, n: int, k: int, variant: str = "mm", batch: int = 1, chain: bool = True) -> int:
        return self.add(
            name, "compute", "gemm", gemm_params(m, n, k, self.dtype, variant=variant, batch=batch), chain=chain
        )

    def cast(self, name: str, numel: int, extra_deps: tuple[int, ...] = (), chain: bool = True) -> int | None:
        """An autocast copy between float32 and the reduced dtype (mixed precision only),
        priced as the copy that moves the same bytes (one element read, one written)."""
        if not self.mixed:
            return None
        nbytes = numel * (FLOAT + self.low_size) // 2
        return self.add(name, "memory", "memcpy", memcpy_params("d2d", nbytes), extra_deps, chain=chain)

    def linear_forward(
        self, name: str, m: int, fan_out: int, fan_in: int, variant: str, bias: bool, float32_input: bool
    ) -> int:
        """A linear's product, after autocast's casts of its weight (and bias) and, where it
        arrives in float32, of its input."""
        self.cast(name + "_weight_cast", fan_in * fan_out + (fan_out if bias else 0))
        if float32_input:
            self.cast(name + "_input_cast", m * fan_in)
        return self.gemm(name, m, fan_out, fan_in, variant)

    def row_parallel_output(self, name: str, fan_in: int, variant: str, dropout: bool, residual: int | None) -> None:
        """A row-parallel linear's output: the product, its TP all-reduce and bias (TP > 1),
        dropout, then the residual add. (Under autocast the product's output is in the reduced
        dtype; the float32 bias added after a TP all-reduce promotes it back to float32.)"""
        T, H = self.spec.batch_size * self.spec.seq_len, self.spec.hidden
        tp = self.spec.tensor_parallel
        self.linear_forward(name, T, H, fan_in, variant, bias=tp == 1, float32_input=False)
        self.tp_all_reduce(name + "_all_reduce", self.low_size * T * H)
        if tp > 1:
            self.elementwise(name + "_bias", "add", T, H)
        if dropout:
            self.elementwise(name + "_dropout", "dropout", T, H, low=tp == 1)
        self.add(name + "_residual", "compute", "add", elementwise_params("add", T, H), (residual,))

    def tp_all_reduce(self, name: str, nbytes: int) -> None:
        if self.spec.tensor_parallel > 1:
            params = {"bytes": int(nbytes), "world": self.spec.tensor_parallel, "scope": self.tp_scope}
            self.add(name, "collective", "all_reduce", params, stream="comm", group=self.tp_group)


@dataclass(frozen=True)
class _Sizes:
    """One rank's sizes of a block's ops (TP splits the heads and the MLP's hidden units)."""

    T: int  # tokens of the local batch
    S: int
    H: int
    tp: int
    local: int  # hidden units of the TP shard
    d: int  # head dim
    BH: int  # batch x local heads: the batched attention products
    low: int  # bytes of a product's output element
    dropout: bool
    bias: str  # the row-parallel products' variant: they add their bias after the all-reduce under TP

    @classmethod
    def of(cls, spec: TransformerSpec) -> "_Sizes":
        B, S, H, tp = spec.micro_batch_size, spec.seq_len, spec.hidden, spec.tensor_parallel
        return cls(
            T=B * S,
            S=S,
            H=H,
            tp=tp,
            local=H // tp,
            d=spec.head_dim,
            BH=B * (spec.heads // tp),
            low=element_bytes(spec.dtype),
            dropout=spec.dropout > 0,
            bias="addmm" if tp == 1 else "mm",
        )


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
    spec: TransformerSpec, placement: RankPlacement | None = None, bucket_bytes: int = DDP_BUCKET_BYTES
) -> ExecutionGraph:
    """`placement`: the node of every rank (default: one node); each TP, DP and pipeline
    group's collectives are priced on the curve of their own scope."""
    placement = placement or RankPlacement.single_node(spec.world_size)
    if placement.world != spec.world_size:
        raise PlacementError(f"placement: {placement.world} ranks placed, the job has world_size={spec.world_size}")
    ranks = [_Iteration(spec, r, placement, bucket_bytes).ops() for r in range(spec.world_size)]
    meta = {
        "job": spec.name,
        "workload": "transformer",
        "layout": spec.layout,
        "tensor_parallel": spec.tensor_parallel,
        "data_parallel": spec.data_parallel,
        "pipeline_parallel": spec.pipeline_parallel,
        "placement": placement.to_dict(),
    }
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


class _Iteration:
    """Rank `r`'s iteration: its stage's micro-batches forward and backward in schedule order
    (receiving and sending activations and gradients between stages), the data-parallel
    gradient reduction, then SGD."""

    def __init__(self, spec: TransformerSpec, r: int, placement: RankPlacement, bucket_bytes: int) -> None:
        self.spec, self.r, self.placement = spec, r, placement
        self.g, self.x = _Rank(spec, r, placement), _Sizes.of(spec)
        self.stage = spec.stage_of(r)
        self.first, self.last = self.stage == 0, self.stage == spec.pipeline_parallel - 1
        self.layers = spec.stage_layers(self.stage)
        self.numel = stage_param_numel(spec, self.stage)
        self.sharded = spec.fsdp != "none" and spec.data_parallel > 1
        ddp = spec.data_parallel > 1 and not self.sharded and spec.pipeline_parallel == 1
        buckets = ddp_buckets(FLOAT * self.numel, bucket_bytes) if ddp else []
        self.ddp = _Ddp(self.g, BucketFill(buckets))
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
        cols = 1024
        g.add(
            "optimizer_step",
            "compute",
            "add",
            elementwise_params("add", -(-numel // cols), cols),
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
        """FSDP's all-gather of one unit's parameters (the output: the whole unit, float32)."""
        if not self.sharded or numel == 0:
            return None
        g, spec = self.g, self.spec
        params = {"bytes": FLOAT * numel, "world": spec.data_parallel, "scope": g.dp_scope}
        return g.add(name, "collective", "all_gather", params, stream="comm", group=g.dp_group, chain=False)

    def reduce_scatter(self, name: str, numel: int, after: int | None) -> None:
        if numel == 0:
            return
        g, spec = self.g, self.spec
        params = {"bytes": FLOAT * numel, "world": spec.data_parallel, "scope": g.dp_scope}
        self.ddp.reduces.append(
            g.add(name, "collective", "reduce_scatter", params, (after,), stream="comm", group=g.dp_group, chain=False)
        )

    def pipeline_gradient_all_reduce(self) -> None:
        """A stage's data-parallel gradient average after its last backward, in DDP-sized
        buckets, one after the other (the workload's `_all_reduce_gradients`)."""
        g = self.g
        for k, size in enumerate(ddp_buckets(FLOAT * self.numel, self.bucket_bytes)):
            params = {"bytes": size, "world": self.spec.data_parallel, "scope": g.dp_scope}
            self.ddp.reduces.append(g.add(f"dp_all_reduce{k}", "collective", "all_reduce", params, group=g.dp_group))

    # -- one micro-batch ------------------------------------------------------------------
    def root_numel(self) -> int:
        """The parameters outside the blocks (FSDP's root unit)."""
        return self.numel - block_param_numel(self.spec) * len(self.layers)

    def forward(self, p: str) -> None:
        spec, g, x = self.spec, self.g, self.x
        gathered = self.gather(p + "root_all_gather", self.root_numel())
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
            _block_forward(g, x, f"{p}b{layer}.", waits[layer])
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
        if self.last:
            if spec.vocab_size:
                g.elementwise(p + "cross_entropy_bwd", "softmax_bwd", x.T, spec.vocab_size)
                g.cast(p + "logits_grad_cast", x.T * spec.vocab_size)
                _linear_backward(g, x, self.ddp, p + "head", x.H, spec.vocab_size, float32_input=True)
            else:
                g.elementwise(p + "mse_loss_bwd", "mul", x.T, x.H)
            g.elementwise(p + "ln_f_bwd", "layer_norm_bwd", x.T, x.H)
            self.ddp.gradients_ready(FLOAT * 2 * x.H, g.prev)
        for layer in reversed(self.layers):
            name = f"{p}b{layer}."
            waited = (
                self.gather(name + "all_gather_bwd", block_param_numel(spec)) if spec.fsdp == "full_shard" else None
            )
            if spec.recompute:
                _block_forward(g, x, "recompute." + name, waited)
                waited = None
            _block_backward(g, x, self.ddp, name, waited)
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


def _block_forward(g: _Rank, x: _Sizes, p: str, waits: int | None = None) -> None:
    """One block forward: attention, then the MLP, each a residual branch; `waits`: the op
    its parameters come from (FSDP's all-gather)."""
    T, S, H, local, d, BH, low = x.T, x.S, x.H, x.local, x.d, x.BH, x.low
    residual = g.prev
    g.add(p + "ln1", "compute", "layer_norm", elementwise_params("layer_norm", T, H), (waits,))
    g.linear_forward(p + "qkv", T, 3 * local, H, "addmm", bias=True, float32_input=True)
    g.add(p + "qkv_permute", "memory", "memcpy", memcpy_params("d2d", low * T * 3 * local))
    g.elementwise(p + "q_scale", "mul", T, local, low=True)
    g.gemm(p + "scores", S, S, d, "bmm", BH)
    g.elementwise(p + "softmax", "softmax", BH * S, S, low=True)
    if x.dropout:
        g.elementwise(p + "attn_dropout", "dropout", BH * S, S, low=True)
    g.gemm(p + "context", S, d, S, "bmm", BH)
    g.add(p + "context_permute", "memory", "memcpy", memcpy_params("d2d", low * T * local))
    g.row_parallel_output(p + "out", local, x.bias, x.dropout, residual)
    residual = g.prev
    g.elementwise(p + "ln2", "layer_norm", T, H)
    g.linear_forward(p + "fc1", T, 4 * local, H, "addmm", bias=True, float32_input=True)
    g.elementwise(p + "gelu", "gelu", T, 4 * local, low=True)
    g.row_parallel_output(p + "fc2", 4 * local, x.bias, x.dropout, residual)


class _Ddp:
    """DDP's gradient all-reduces of one rank: a bucket's is launched once its last gradient is written."""

    def __init__(self, g: _Rank, buckets: BucketFill) -> None:
        self.g, self.buckets = g, buckets
        self.reduces: list[int] = []
        self.active = True  # False: a micro-batch under no_sync (gradients accumulate, no reduction)

    def gradients_ready(self, nbytes: int, after: int | None) -> None:
        g = self.g
        if not self.active:
            return
        for size in self.buckets.add(nbytes):
            params = {"bytes": size, "world": g.spec.data_parallel, "scope": g.dp_scope}
            self.reduces.append(
                g.add(
                    f"ddp_all_reduce{len(self.reduces)}",
                    "collective",
                    "all_reduce",
                    params,
                    (after,),
                    stream="comm",
                    group=g.dp_group,
                    chain=False,
                )
            )


def _block_backward(g: _Rank, x: _Sizes, ddp: _Ddp, p: str, waits: int | None = None) -> None:
    """One block backward, the MLP first; its weights' gradients fill DDP's buckets. `waits`:
    the op its parameters come from (FSDP's all-gather for the backward)."""
    T, S, H, local, d, BH, low = x.T, x.S, x.H, x.local, x.d, x.BH, x.low
    if waits is not None:
        g.prev = max(waits, g.prev) if g.prev is not None else waits
    _output_grad_backward(g, x, p + "fc2", p + "mlp_dropout_bwd")
    _linear_backward(g, x, ddp, p + "fc2", 4 * local, H)
    g.elementwise(p + "gelu_bwd", "gelu_bwd", T, 4 * local, low=True)
    _linear_backward(g, x, ddp, p + "fc1", H, 4 * local, float32_input=True)
    g.tp_all_reduce(p + "fc1_input_grad_all_reduce", FLOAT * T * H)
    g.elementwise(p + "ln2_bwd", "layer_norm_bwd", T, H)
    ddp.gradients_ready(FLOAT * 2 * H, g.prev)
    g.elementwise(p + "residual2_grad", "add", T, H)
    _output_grad_backward(g, x, p + "out", p + "out_dropout_bwd")
    _linear_backward(g, x, ddp, p + "out", local, H)
    g.add(p + "context_permute_bwd", "memory", "memcpy", memcpy_params("d2d", low * T * local))
    g.gemm(p + "context_grad_attn", S, S, d, "bmm", BH)
    g.gemm(p + "context_grad_v", S, d, S, "bmm", BH)
    if x.dropout:
        g.elementwise(p + "attn_dropout_bwd", "mul", BH * S, S, low=True)
    g.elementwise(p + "softmax_bwd", "softmax_bwd", BH * S, S, low=True)
    g.gemm(p + "scores_grad_q", S, d, S, "bmm", BH)
    g.gemm(p + "scores_grad_k", S, d, S, "bmm", BH)
    g.elementwise(p + "q_scale_bwd", "mul", T, local, low=True)
    g.add(p + "qkv_permute_bwd", "memory", "memcpy", memcpy_params("d2d", low * T * 3 * local))
    _linear_backward(g, x, ddp, p + "qkv", H, 3 * local, float32_input=True)
    g.tp_all_reduce(p + "qkv_input_grad_all_reduce", FLOAT * T * H)
    g.elementwise(p + "ln1_bwd", "layer_norm_bwd", T, H)
    ddp.gradients_ready(FLOAT * 2 * H, g.prev)
    g.elementwise(p + "residual1_grad", "add", T, H)


def _output_grad_backward(g: _Rank, x: _Sizes, name: str, dropout_name: str) -> None:
    """The residual branch's gradient back to a row-parallel output: dropout's masked
    multiply, and under autocast the cast of the float32 gradient to the product's dtype
    (before the multiply when the dropout saw the product's output, after it when a TP
    bias had promoted that to float32)."""
    if x.tp == 1:
        g.cast(name + "_grad_output_cast", x.T * x.H)
    if x.dropout:
        g.elementwise(dropout_name, "mul", x.T, x.H, low=x.tp == 1)
    if x.tp > 1:
        g.cast(name + "_grad_output_cast", x.T * x.H)


def _linear_backward(
    g: _Rank, x: _Sizes, ddp: _Ddp, name: str, fan_in: int, fan_out: int, float32_input: bool = False
) -> None:
    """Under autocast the weight's gradient is cast back to float32 before DDP sees it,
    and so is the input's where the forward cast a float32 input."""
    grad_weight = g.gemm(name + "_grad_weight", fan_out, fan_in, x.T, chain=False)
    g.gemm(name + "_grad_input", x.T, fan_in, fan_out)
    weight_cast = g.cast(name + "_grad_weight_cast", fan_in * fan_out + fan_out, (grad_weight,), chain=False)
    if float32_input:
        g.cast(name + "_grad_input_cast", x.T * fan_in)
    ddp.gradients_ready(FLOAT * (fan_in * fan_out + fan_out), grad_weight if weight_cast is None else weight_cast)

"""The ops of one GPT-style block on one rank, forward and backward, as
`probes/workloads/transformer_block.py` runs them (predictors/transformer_graph.py strings them
into a layout's iteration).

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

from predictors.ddp_buckets import GRADIENT_REDUCE, BucketFill
from predictors.dlrm_graph import FLOAT
from predictors.graph import GraphOp
from probes.vocabulary.ops import element_bytes, elementwise_params, gemm_params, memcpy_params
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.transformer_spec import TransformerSpec


def block_param_numel(spec: TransformerSpec) -> int:
    """Parameters of one block on one rank (TP shards the four linear layers)."""
    H, local = spec.hidden, spec.hidden // spec.tensor_parallel
    linears = (H * 3 * local + 3 * local) + (local * H + H) + (H * 4 * local + 4 * local) + (4 * local * H + H)
    return linears + 4 * H  # two layer norms


class RankOps:
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

    def elementwise(
        self, name: str, op: str, rows: int, cols: int, low: bool = False, extra_deps: tuple[int | None, ...] = ()
    ) -> int:
        """`low`: the op sees the products' reduced-precision outputs (else float32)."""
        params = elementwise_params(op, rows, cols, self.dtype if low else "float32")
        return self.add(name, "compute", op, params, extra_deps)

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
        T, H = self.spec.micro_batch_size * self.spec.seq_len, self.spec.hidden
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
class BlockSizes:
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
    def of(cls, spec: TransformerSpec) -> "BlockSizes":
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


def block_forward(g: RankOps, x: BlockSizes, p: str, waits: int | None = None) -> None:
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


class DdpBuckets:
    """DDP's gradient all-reduces of one rank: a bucket's is launched once its last gradient is written.

    The reducer's own memory passes are not listed: each gradient written into its bucket
    divided by the group's size, and the buckets copied back after the reduction (traced at
    2.6 ms of a 72 ms two-rank CPU step, #26). Listed, they were priced at 1.8 ms isolated and
    then slowed again by the refitted overhead's memory-bound term, and on eight stored cycles
    moved the data-parallel runs' signed error +2.1 points [+0.3, +3.9] (README, 12-05), so
    the step overhead carries them."""

    def __init__(self, g: RankOps, buckets: BucketFill) -> None:
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
                    f"{GRADIENT_REDUCE}{len(self.reduces)}",
                    "collective",
                    "all_reduce",
                    params,
                    (after,),
                    stream="comm",
                    group=g.dp_group,
                    chain=False,
                )
            )


def block_backward(g: RankOps, x: BlockSizes, ddp: DdpBuckets, p: str, waits: int | None = None) -> None:
    """One block backward, the MLP first; its weights' gradients fill DDP's buckets. `waits`:
    the op its parameters come from (FSDP's all-gather for the backward)."""
    T, S, H, local, d, BH, low = x.T, x.S, x.H, x.local, x.d, x.BH, x.low
    if waits is not None:
        g.prev = max(waits, g.prev) if g.prev is not None else waits
    output_grad_backward(g, x, p + "fc2", p + "mlp_dropout_bwd")
    linear_backward(g, x, ddp, p + "fc2", 4 * local, H)
    g.elementwise(p + "gelu_bwd", "gelu_bwd", T, 4 * local, low=True)
    linear_backward(g, x, ddp, p + "fc1", H, 4 * local, float32_input=True)
    g.tp_all_reduce(p + "fc1_input_grad_all_reduce", FLOAT * T * H)
    g.elementwise(p + "ln2_bwd", "layer_norm_bwd", T, H)
    ddp.gradients_ready(FLOAT * 2 * H, g.prev)
    g.elementwise(p + "residual2_grad", "add", T, H)
    output_grad_backward(g, x, p + "out", p + "out_dropout_bwd")
    linear_backward(g, x, ddp, p + "out", local, H)
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
    linear_backward(g, x, ddp, p + "qkv", H, 3 * local, float32_input=True)
    g.tp_all_reduce(p + "qkv_input_grad_all_reduce", FLOAT * T * H)
    g.elementwise(p + "ln1_bwd", "layer_norm_bwd", T, H)
    ddp.gradients_ready(FLOAT * 2 * H, g.prev)
    g.elementwise(p + "residual1_grad", "add", T, H)


def output_grad_backward(g: RankOps, x: BlockSizes, name: str, dropout_name: str) -> None:
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


def linear_backward(
    g: RankOps, x: BlockSizes, ddp: DdpBuckets, name: str, fan_in: int, fan_out: int, float32_input: bool = False
) -> None:
    """Under autocast the weight's gradient is cast back to float32 before DDP sees it,
    and so is the input's where the forward cast a float32 input."""
    grad_weight = g.gemm(name + "_grad_weight", fan_out, fan_in, x.T, chain=False)
    g.gemm(name + "_grad_input", x.T, fan_in, fan_out)
    weight_cast = g.cast(name + "_grad_weight_cast", fan_in * fan_out + fan_out, (grad_weight,), chain=False)
    if float32_input:
        g.cast(name + "_grad_input_cast", x.T * fan_in)
    ddp.gradients_ready(FLOAT * (fan_in * fan_out + fan_out), grad_weight if weight_cast is None else weight_cast)

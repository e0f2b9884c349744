"""A GPT-style block stack trained with data and tensor parallelism: the real job the
transformer execution-graph builder (predictors/transformer_graph.py) mirrors op for op.

Pre-LN blocks: layer_norm → QKV projection → scaled q·kᵀ → softmax → dropout → ·v → output
projection → dropout → residual; layer_norm → fc1 → gelu → fc2 → dropout → residual. Tensor
parallelism splits heads and the fc1 width Megatron-style: QKV and fc1 are column-parallel
(the input's gradient is all-reduced over the TP group in backward), the output projection
and fc2 are row-parallel (their outputs are all-reduced in forward, bias added after). Data
parallelism all-reduces gradients with DDP over the ranks holding the same TP shard. The
input is a random activation batch and the loss a mean-squared error against a random
target: the block stack is what is timed, not a tokenizer.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from probes.comm import destroy_groups
from probes.vocabulary.pairs import SYMM_MEM_SLICES
from probes.vocabulary.transformer_spec import CPU_DTYPES, TransformerSpec
from probes.workloads.overlap import overlapped_gemm_all_reduce, symm_mem_gemm_all_reduce
from probes.workloads.timed_steps import RunResult, run_timed_steps


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient over the TP group in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce of partial outputs over the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _OverlappedRowParallel(torch.autograd.Function):
    """A row-parallel linear's product and the all-reduce of its partial sums, overlapped in
    `slices` slices (`probes.workloads.overlap.overlapped_gemm_all_reduce`); backward as the unfused
    pair's: the all-reduce passes the gradient through, the product's two GEMMs follow."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, group: Any, slices: int) -> torch.Tensor:
        # the product runs in the precision the unfused linear would: autocast's, if it is on
        # (its sliced `out=` products are not autocast themselves); gradients return in the
        # inputs' own dtypes (float32 weights)
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        ctx.dtypes = (x.dtype, weight.dtype)
        x, weight = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x, weight)
        if slices == SYMM_MEM_SLICES:  # PyTorch's symmetric-memory fused kernels (CUDA)
            return symm_mem_gemm_all_reduce(x, weight.t(), group)
        return overlapped_gemm_all_reduce(x, weight.t(), slices, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.to(x.dtype)
        return (grad @ weight).to(ctx.dtypes[0]), (grad.t() @ x).to(ctx.dtypes[1]), None, None


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec, tp_group: Any, overlap_slices: dict[str, int] | None = None):
        """`overlap_slices`: per row-parallel linear ("out", "fc2"), the slice count of its
        overlapped product + all-reduce (the plan's substitution decision); absent: unfused."""
        super().__init__()
        self.overlap_slices = dict(overlap_slices or {})
        H, tp = spec.hidden, spec.tensor_parallel
        self.spec, self.tp_group = spec, tp_group
        self.local_heads = spec.heads // tp
        local = H // tp
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv = nn.Linear(H, 3 * local)
        self.out = nn.Linear(local, H, bias=tp == 1)
        self.fc1 = nn.Linear(H, 4 * local)
        self.fc2 = nn.Linear(4 * local, H, bias=tp == 1)
        if tp > 1:  # row-parallel biases are added once, after the all-reduce
            self.out_bias, self.fc2_bias = nn.Parameter(torch.zeros(H)), nn.Parameter(torch.zeros(H))

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        return _CopyToTensorParallel.apply(x, self.tp_group) if self.spec.tensor_parallel > 1 else x

    def _leave(self, x: torch.Tensor, bias: str) -> torch.Tensor:
        if self.spec.tensor_parallel == 1:
            return x
        return _ReduceFromTensorParallel.apply(x, self.tp_group) + getattr(self, bias)

    def _row_parallel(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The row-parallel linear `name` with its all-reduce and bias: overlapped when the
        block was given a slice count for it."""
        slices = self.overlap_slices.get(name, 1)
        if self.spec.tensor_parallel == 1 or slices == 1:
            return self._leave(getattr(self, name)(x), name + "_bias")
        out = _OverlappedRowParallel.apply(x, getattr(self, name).weight, self.tp_group, slices)
        return out + getattr(self, name + "_bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, d, h = self.spec.batch_size, self.spec.seq_len, self.spec.head_dim, self.local_heads
        p = self.spec.dropout
        qkv = self.qkv(self._enter(self.ln1(x)))  # [B*S, 3*h*d]
        qkv = qkv.view(B, S, 3, h, d).permute(2, 0, 3, 1, 4).contiguous().view(3, B * h, S, d)
        q, k, v = qkv[0] * (1.0 / math.sqrt(d)), qkv[1], qkv[2]
        attn = F.dropout(torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1), p, self.training)
        ctx = torch.bmm(attn, v).view(B, h, S, d).transpose(1, 2).contiguous().view(B * S, h * d)
        x = x + F.dropout(self._row_parallel("out", ctx), p, self.training)
        y = F.gelu(self.fc1(self._enter(self.ln2(x))))
        return x + F.dropout(self._row_parallel("fc2", y), p, self.training)


class BlockStack(nn.Module):
    def __init__(self, spec: TransformerSpec, tp_group: Any, overlap_slices: dict[str, int] | None = None):
        """`overlap_slices`: "b{layer}.{out|fc2}" -> slices, as the substitution decision names pairs."""
        super().__init__()
        per_block = [
            {
                name.split(".", 1)[1]: k
                for name, k in (overlap_slices or {}).items()
                if name.split(".", 1)[0] == f"b{layer}"
            }
            for layer in range(spec.layers)
        ]
        self.blocks = nn.ModuleList(Block(spec, tp_group, per_block[layer]) for layer in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


class ParallelTransformer:
    """One rank of the block stack on the default process group (gloo or NCCL)."""

    def __init__(
        self,
        spec: TransformerSpec,
        rank: int,
        device: torch.device,
        comm_hook: tuple[Any, Callable[..., Any]] | None = None,
        overlap_slices: dict[str, int] | None = None,
    ):
        """`comm_hook`: (state, hook) registered on the DDP module, e.g. the hierarchical
        all-reduce of probes/workloads/hierarchical_allreduce.py; None keeps DDP's own all-reduce.
        `overlap_slices`: the substitution decision's {"b0.out": k, ...}: those row-parallel
        products run overlapped with their all-reduce."""
        if dist.get_world_size() != spec.world_size:
            raise ValueError(f"spec wants world_size={spec.world_size}, the process group has {dist.get_world_size()}")
        device = torch.device(device)
        if device.type != "cuda" and spec.dtype not in CPU_DTYPES:
            raise ValueError(
                f"dtype: {spec.dtype!r} needs a CUDA device (float16 autocast trains with a GradScaler); "
                f"on {device.type} the allowed values are {list(CPU_DTYPES)}"
            )
        self.spec, self.rank, self.device = spec, rank, device
        # Every rank creates every group, in the same order (torch.distributed requires it).
        tp_groups = (
            {g: dist.new_group(list(g)) for g in sorted({spec.tp_group_of(r) for r in range(spec.world_size)})}
            if spec.tensor_parallel > 1
            else {}
        )
        dp_groups = (
            {g: dist.new_group(list(g)) for g in sorted({spec.dp_group_of(r) for r in range(spec.world_size)})}
            if 1 < spec.data_parallel < spec.world_size
            else {}
        )
        torch.manual_seed(spec.seed + rank % spec.tensor_parallel)  # TP shards differ, DP replicas agree
        module = BlockStack(spec, tp_groups.get(spec.tp_group_of(rank)), overlap_slices).to(device)
        if spec.data_parallel > 1:
            dp_group = dp_groups.get(spec.dp_group_of(rank))  # None: the default group
            module = nn.parallel.DistributedDataParallel(module, process_group=dp_group)
            if comm_hook is not None:
                module.register_comm_hook(*comm_hook)
        self.model = module
        self.groups = list(tp_groups.values()) + list(dp_groups.values())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cuda") if spec.dtype == "float16" else None
        dp_rank = rank // spec.tensor_parallel
        rng = np.random.default_rng([spec.seed, dp_rank])
        shape = (spec.batch_size * spec.seq_len, spec.hidden)
        self.x = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(device)
        self.target = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for bfloat16 / float16 (parameters, gradients and SGD stay float32);
        float32 runs without autocast, so its step is the op sequence it always was."""
        if self.spec.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.spec.dtype))

    def step(self) -> float:
        with self._autocast():
            loss = F.mse_loss(self.model(self.x), self.target)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return float(loss.detach())

    def run(self, iterations: int, warmup: int) -> RunResult:
        return run_timed_steps(lambda _i: self.step(), iterations, warmup, self.device)

    def close(self) -> None:
        """Destroy the TP / DP subgroups made for this stack (each NCCL communicator holds device
        memory); a calibration builds many stacks on one process group."""
        destroy_groups(self.groups)
        self.groups = []

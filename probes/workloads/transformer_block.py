"""One GPT-style block under Megatron-style tensor parallelism, and the full weights every
layout starts from (probes/workloads/transformer.py builds the stack and trains it).

Pre-LN: layer_norm → QKV projection → scaled q·kᵀ → softmax → dropout → ·v → output projection
→ dropout → residual; layer_norm → fc1 → gelu → fc2 → dropout → residual. QKV and fc1 are
column-parallel (the input's gradient is all-reduced over the TP group in backward), the output
projection and fc2 row-parallel (their outputs all-reduced in forward, bias added after).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from probes.vocabulary.pairs import SYMM_MEM_SLICES
from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.overlap import overlapped_gemm_all_reduce, symm_mem_gemm_all_reduce


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


def uniform_init(generator: torch.Generator, shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
    """nn.Linear's default range, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from `generator`."""
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


def full_block_weights(spec: TransformerSpec, layer: int) -> dict[str, torch.Tensor]:
    """Block `layer`'s unpartitioned linear weights and biases, the same in every layout."""
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + layer)
    H = spec.hidden
    return {
        "qkv.weight": uniform_init(g, (3 * H, H), H),
        "qkv.bias": uniform_init(g, (3 * H,), H),
        "out.weight": uniform_init(g, (H, H), H),
        "out.bias": uniform_init(g, (H,), H),
        "fc1.weight": uniform_init(g, (4 * H, H), H),
        "fc1.bias": uniform_init(g, (4 * H,), H),
        "fc2.weight": uniform_init(g, (H, 4 * H), 4 * H),
        "fc2.bias": uniform_init(g, (H,), 4 * H),
    }


def tp_shard(spec: TransformerSpec, name: str, full: torch.Tensor, tp_rank: int) -> torch.Tensor:
    """Rank `tp_rank`'s piece of a full block tensor: QKV by heads (its output is laid out
    [q|k|v] x heads x head_dim), fc1 by rows, the row-parallel weights by columns; the
    row-parallel biases whole (added once, after the all-reduce)."""
    tp = spec.tensor_parallel
    if tp == 1 or name in ("out.bias", "fc2.bias"):
        return full
    if name.startswith("qkv."):
        per = spec.heads // tp
        shaped = full.view(3, spec.heads, spec.head_dim, *full.shape[1:])
        return shaped[:, tp_rank * per : (tp_rank + 1) * per].reshape(-1, *full.shape[1:])
    if name.startswith("fc1."):
        return full.chunk(tp, dim=0)[tp_rank]
    return full.chunk(tp, dim=1)[tp_rank]  # out.weight, fc2.weight


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

    @torch.no_grad()
    def load_full(self, weights: dict[str, torch.Tensor], tp_rank: int) -> None:
        """Take this TP rank's shard of the block's full weights (`full_block_weights`)."""
        for name, full in weights.items():
            module, kind = name.split(".")
            piece = tp_shard(self.spec, name, full, tp_rank)
            target = (
                getattr(self, f"{module}_bias")
                if kind == "bias" and self.spec.tensor_parallel > 1 and module in ("out", "fc2")
                else getattr(getattr(self, module), kind)
            )
            target.copy_(piece)

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
        """`x`: [tokens, hidden], whole sequences (a micro-batch is any number of them)."""
        S, d, h = self.spec.seq_len, self.spec.head_dim, self.local_heads
        B = x.shape[0] // S
        p = self.spec.dropout
        qkv = self.qkv(self._enter(self.ln1(x)))  # [B*S, 3*h*d]
        qkv = qkv.view(B, S, 3, h, d).permute(2, 0, 3, 1, 4).contiguous().view(3, B * h, S, d)
        q, k, v = qkv[0] * (1.0 / math.sqrt(d)), qkv[1], qkv[2]
        attn = F.dropout(torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1), p, self.training)
        ctx = torch.bmm(attn, v).view(B, h, S, d).transpose(1, 2).contiguous().view(B * S, h * d)
        x = x + F.dropout(self._row_parallel("out", ctx), p, self.training)
        y = F.gelu(self.fc1(self._enter(self.ln2(x))))
        return x + F.dropout(self._row_parallel("fc2", y), p, self.training)

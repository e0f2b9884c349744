"""A real DLRM training loop, sharded table-wise per a plan, on an initialised process group.

Per rank: the bottom and top MLPs are data parallel (DDP, gradient all-reduce in buckets);
each embedding table lives on the rank the plan assigns it to and is looked up there by one
FBGEMM TBE for the whole global batch; a forward all-to-all (uneven: ranks hold different
embedding widths) turns model-parallel pooled embeddings into data-parallel ones, and its
autograd twin sends gradients back. The synthetic loader yields the indices of each rank's own
tables, so no input all-to-all is needed (as with a table-wise sharded data pipeline).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from probes.embedding import make_batch, make_tbe
from probes.jobspec import JobSpec
from probes.workloads.timed_steps import RunResult, run_timed_steps


class _AllToAllSingle(torch.autograd.Function):
    """Uneven all-to-all whose backward is the all-to-all with send and receive sizes swapped."""

    @staticmethod
    def forward(ctx, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        ctx.send_sizes, ctx.recv_sizes = send_sizes, recv_sizes
        recv = send.new_empty(sum(recv_sizes))
        dist.all_to_all_single(recv, send.contiguous(), recv_sizes, send_sizes)
        return recv

    @staticmethod
    def backward(ctx, grad_recv: torch.Tensor):
        grad_send = grad_recv.new_empty(sum(ctx.send_sizes))
        dist.all_to_all_single(grad_send, grad_recv.contiguous(), ctx.send_sizes, ctx.recv_sizes)
        return grad_send, None, None


def all_to_all_autograd(send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
    return _AllToAllSingle.apply(send, send_sizes, recv_sizes)


def mlp(widths: Sequence[int], in_features: int, final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    prev = in_features
    for i, width in enumerate(widths):
        layers.append(nn.Linear(prev, width))
        if i < len(widths) - 1 or final_activation:
            layers.append(nn.ReLU())
        prev = width
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP on dense features, concatenation with the pooled embeddings, top MLP."""

    def __init__(self, spec: JobSpec):
        super().__init__()
        emb_width = sum(t.embedding_dim for t in spec.tables)
        self.bottom = mlp(spec.dense.bottom_mlp, spec.dense.num_dense_features, final_activation=True)
        self.top = mlp(spec.dense.top_mlp, spec.dense.bottom_mlp[-1] + emb_width, final_activation=False)

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return self.top(torch.cat([self.bottom(dense), embeddings], dim=1)).squeeze(1)


class ShardedDLRM:
    """One rank's share of a table-wise sharded DLRM."""

    def __init__(self, spec: JobSpec, table_to_rank: Sequence[int], rank: int, world: int, device: torch.device):
        if len(table_to_rank) != len(spec.tables):
            raise ValueError(f"plan places {len(table_to_rank)} tables, job has {len(spec.tables)}")
        if any(r < 0 or r >= world for r in table_to_rank):
            raise ValueError(f"plan uses ranks outside 0..{world - 1}: {sorted(set(table_to_rank))}")
        self.spec, self.rank, self.world, self.device = spec, rank, world, device
        self.local = [i for i, r in enumerate(table_to_rank) if r == rank]
        # Width of the pooled embeddings each rank sends (its tables' dims summed).
        self.rank_width = [
            sum(spec.tables[i].embedding_dim for i, r in enumerate(table_to_rank) if r == q) for q in range(world)
        ]
        torch.manual_seed(spec.seed)  # identical dense init on every rank (DDP also broadcasts)
        self.dense = DistributedDataParallel(DenseArch(spec).to(device))
        self.optimizer = torch.optim.SGD(self.dense.parameters(), lr=0.01)
        self.tbe = make_tbe([spec.tables[i].shape for i in self.local], device) if self.local else None
        self.batches = self._make_batches(num=4)

    def _make_batches(self, num: int) -> list[dict[str, torch.Tensor]]:
        """A few distinct batches, cycled, so data generation stays off the timed path."""
        spec, B, W = self.spec, self.spec.batch_size, self.world
        out = []
        for step in range(num):
            rng = np.random.default_rng([spec.seed, step, self.rank])
            batch = {
                "dense": torch.from_numpy(rng.standard_normal((B, spec.dense.num_dense_features), dtype=np.float32)),
                "labels": torch.from_numpy((rng.random(B) < 0.5).astype(np.float32)),
            }
            if self.local:
                # The global batch of this rank's tables: the same rows every rank's loader sees.
                trng = np.random.default_rng([spec.seed, step, 10_000 + self.rank])
                flat, offsets, _ = make_batch([spec.tables[i].shape for i in self.local], B * W, trng)
                batch["indices"], batch["offsets"] = torch.from_numpy(flat), torch.from_numpy(offsets)
            out.append({k: v.to(self.device) for k, v in batch.items()})
        return out

    def _exchange(self, pooled: torch.Tensor) -> torch.Tensor:
        """Model-parallel [W*B, width_r] → data-parallel [B, sum of widths] (autograd aware)."""
        B, W = self.spec.batch_size, self.world
        send = pooled.reshape(-1)
        recv_sizes = [B * w for w in self.rank_width]
        send_sizes = [B * self.rank_width[self.rank]] * W
        recv = all_to_all_autograd(send, send_sizes, recv_sizes)
        parts = [p.view(B, w) for p, w in zip(torch.split(recv, recv_sizes), self.rank_width)]
        return torch.cat(parts, dim=1)

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        B, W = self.spec.batch_size, self.world
        if self.tbe is not None:
            pooled = self.tbe(batch["indices"], batch["offsets"])  # [W*B, width_r], sample-major
        else:
            pooled = torch.zeros(W * B, 0, device=self.device, requires_grad=True)
        embeddings = self._exchange(pooled)
        logits = self.dense(batch["dense"], embeddings)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch["labels"])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduce, backward all-to-all, TBE backward with fused SGD
        self.optimizer.step()
        return float(loss.detach())

    def run(self, iterations: int, warmup: int) -> RunResult:
        return run_timed_steps(lambda i: self.step(self.batches[i % len(self.batches)]), iterations, warmup,
                               self.device)

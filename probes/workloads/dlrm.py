"""A real DLRM training loop, sharded per a plan, on an initialised process group.

Per rank: the bottom and top MLPs are data parallel (DDP, gradient all-reduce in buckets).
The embedding tables follow the plan (`probes.vocabulary.table_shards`), so every plan the predictor
prices can be run and checked:
- table-wise tables and column-wise pieces live on their rank and are looked up there by one
  FBGEMM TBE (exact SGD fused into backward) for the whole global batch; a forward all-to-all
  (uneven: ranks hold different embedding widths) turns their model-parallel pooled embeddings
  into data-parallel ones, and its autograd twin sends gradients back;
- row-wise tables are split into row ranges, one per rank; each rank looks up the global
  batch's indices that fall in its range (a second fused-SGD TBE) and the partial pooled sums
  are reduce-scattered to the ranks owning the samples (all-gathered back in backward);
- data-parallel tables are replicated; each rank looks up its local batch with a dense-gradient
  TBE, and the gradients are all-reduced (averaged) before the optimizer step.
With `overlap_slices` = k > 1 (the plan's substitution decision for the embedding + all-to-all
pair), the table-wise lookup and its forward all-to-all run overlapped
(`probes.workloads.overlap.overlapped_all_to_all`): the lookup in k bag slices, remote ranks' bags first,
each slice's rows sent as soon as they are pooled; backward is one reverse all-to-all whose
gradient rows are handed back to each slice's lookup (k TBE backwards).
The synthetic loader yields every table's global-batch indices from a per-table seed, so the
ranks holding pieces of one table see the same ids, and a rank's indices are already the ones
its pieces need (as with a sharded data pipeline): no input all-to-all is run.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from probes.comm import all_gather_single, reduce_scatter_single
from probes.embedding import check_weights_precision, make_dense_tbe, make_tbe
from probes.vocabulary.indices import sample_indices
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.pairs import ExchangeLayout
from probes.vocabulary.table_shards import (
    DATA_PARALLEL,
    EXCHANGED,
    ROW_WISE,
    TableShard,
    exchanged_widths,
    table_shards,
)
from probes.vocabulary.tbe_features import expected_features
from probes.workloads.hierarchical_allreduce import chunked_comm_hook
from probes.workloads.overlap import overlapped_all_to_all, producer_ranges, slice_runs, tbe_bag_ranges
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


class _JoinOverlappedExchange(torch.autograd.Function):
    """Ties the overlapped exchange's output to the slices it was sent from: forward passes the
    received rows through; backward runs the reverse all-to-all once and hands each slice the
    gradient rows of the producer rows it computed (in the slice's own row order)."""

    @staticmethod
    def forward(ctx, received: torch.Tensor, layout: ExchangeLayout, slices: int, *kept: torch.Tensor) -> torch.Tensor:
        ctx.layout, ctx.slices = layout, slices
        return received

    @staticmethod
    def backward(ctx, grad_recv: torch.Tensor):
        layout, rank = ctx.layout, dist.get_rank()
        grad_send = grad_recv.new_empty(sum(layout.send_sizes(rank)))
        dist.all_to_all_single(grad_send, grad_recv.contiguous(), layout.send_sizes(rank), layout.recv_sizes(rank))
        rows = grad_send.view(layout.rows(rank), layout.widths[rank])
        per_slice = []
        for runs in slice_runs(layout, rank, ctx.slices):
            parts = [rows[a:b] for a, b in runs]
            per_slice.append(parts[0] if len(parts) == 1 else torch.cat(parts))
        return (None, None, None, *per_slice)


class _ReduceScatterSamples(torch.autograd.Function):
    """[W*B, D] partial sums of the global batch -> [B, D] summed rows of this rank's samples;
    backward all-gathers the samples' gradients (each rank's partial sum fed every sample)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, world: int) -> torch.Tensor:
        rows, width = partial.shape
        ctx.world = world
        out = partial.new_empty(rows // world * width)
        reduce_scatter_single(out, partial.contiguous().view(-1))
        return out.view(rows // world, width)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        full = grad.new_empty(ctx.world * grad.numel())
        all_gather_single(full, grad.contiguous().view(-1))
        return full.view(ctx.world * grad.shape[0], grad.shape[1]), None


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


def _row_ranges(shards: Sequence[TableShard]) -> dict[tuple[int, int], int]:
    """First row of every row-wise piece, keyed by (table, rank): the pieces of a table follow
    one another in rank order (`table_shards` splits the rows that way)."""
    first: dict[tuple[int, int], int] = {}
    next_row: dict[int, int] = {}
    for s in shards:
        if s.kind == ROW_WISE:
            first[(s.table, s.rank)] = next_row.get(s.table, 0)
            next_row[s.table] = first[(s.table, s.rank)] + s.shape.num_embeddings
    return first


def _tbe_input(per_table: Sequence[np.ndarray], lengths: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """TBE's table-major flat indices and offsets from each table's ids and bag lengths."""
    flat = np.concatenate(per_table).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
    return torch.from_numpy(flat), torch.from_numpy(offsets)


class ShardedDLRM:
    """One rank's share of a DLRM sharded per a plan (one entry per table: a rank for
    table-wise, or a row-/column-wise / data-parallel object, see `probes.vocabulary.table_shards`)."""

    def __init__(
        self,
        spec: JobSpec,
        plan: Sequence,
        rank: int,
        world: int,
        device: torch.device,
        chunk_schedule: dict | None = None,
        overlap_slices: int = 1,
        weights_precision: str = "fp32",
    ):
        """`chunk_schedule`: a `ChunkSchedule` as a dict (the plan's chunking decision); the dense
        layers' gradients are then averaged by the hierarchical all-reduce it describes instead
        of DDP's own. `overlap_slices`: the slice count of the overlapped lookup + all-to-all
        (the substitution decision's "embedding_all_to_all"); 1 runs them unfused.
        `weights_precision`: how the fused-SGD TBEs (table- / column- and row-wise pieces) store
        their tables ("fp32", "fp16"; "bf16" on CUDA), as `probes.embedding.measure_tbe` probes
        them; their pooled outputs stay float32. Data-parallel replicas stay float32."""
        if overlap_slices < 1:
            raise ValueError(f"overlap_slices must be >= 1, got {overlap_slices}")
        check_weights_precision(weights_precision, device)
        if spec.world_size != world:  # the process group decides; the plan is checked against it
            spec = replace(spec, world_size=world)
        shards = table_shards(spec, plan)
        self.spec, self.rank, self.world, self.device = spec, rank, world, device
        mine = [s for s in shards if s.rank == rank]
        self.exchanged = [s for s in mine if s.kind in EXCHANGED]
        self.row_wise = [s for s in mine if s.kind == ROW_WISE]
        self.replicated = [s for s in mine if s.kind == DATA_PARALLEL]
        self.first_row = _row_ranges(shards)
        # Width of the pooled embeddings each rank sends (its table- and column-wise pieces).
        self.rank_width = exchanged_widths(spec, shards)
        self.overlap_slices = int(overlap_slices)
        self.layout = ExchangeLayout.even(world, spec.batch_size, self.rank_width)
        torch.manual_seed(spec.seed)  # identical dense init on every rank (DDP also broadcasts)
        self.dense = DistributedDataParallel(DenseArch(spec).to(device))
        if chunk_schedule is not None:
            self.dense.register_comm_hook(*chunked_comm_hook(chunk_schedule))
        self.weights_precision = weights_precision
        self.tbe = (
            make_tbe([s.shape for s in self.exchanged], device, weights_precision=weights_precision)
            if self.exchanged
            else None
        )
        self.rw_tbe = (
            make_tbe([s.shape for s in self.row_wise], device, weights_precision=weights_precision)
            if self.row_wise
            else None
        )
        self.dp_tbe = make_dense_tbe([s.shape for s in self.replicated], device) if self.replicated else None
        params = list(self.dense.parameters())
        if self.dp_tbe is not None:
            for p in self.dp_tbe.parameters():
                dist.broadcast(p.data, src=0)  # the replicas start identical
            params += list(self.dp_tbe.parameters())
        self.optimizer = torch.optim.SGD(params, lr=0.01)
        self.batches = self._make_batches(num=4)

    def lookup_features(self) -> dict[str, Any] | None:
        """The embedding model's params of this rank's one lookup, as the execution graph prices
        it (`predictors.dlrm_graph`: the rank's pieces, the global batch, the job's seed), when
        its step runs exactly one lookup and one backward that a trace can tell apart: table-
        and column-wise pieces only, not sliced for overlap (None otherwise, or with no tables)."""
        if not self.exchanged or self.row_wise or self.replicated or self.overlap_slices > 1:
            return None
        B, W = self.spec.batch_size, self.world
        return expected_features([s.shape for s in self.exchanged], B * W, self.spec.seed, self.weights_precision)

    def _global_ids(self, step: int, table: int) -> np.ndarray:
        """The global batch's ids of one table, [W*B bags x pooling], the same on every rank."""
        t, B, W = self.spec.tables[table], self.spec.batch_size, self.world
        rng = np.random.default_rng([self.spec.seed, step, 20_000 + table])
        return sample_indices(t.num_embeddings, B * W * t.pooling_factor, t.distribution, rng).reshape(
            B * W, t.pooling_factor
        )

    def _make_batches(self, num: int) -> list[dict[str, torch.Tensor]]:
        """A few distinct batches, cycled, so data generation stays off the timed path."""
        spec, B, W, r = self.spec, self.spec.batch_size, self.world, self.rank
        out = []
        for step in range(num):
            rng = np.random.default_rng([spec.seed, step, r])
            batch = {
                "dense": torch.from_numpy(rng.standard_normal((B, spec.dense.num_dense_features), dtype=np.float32)),
                "labels": torch.from_numpy((rng.random(B) < 0.5).astype(np.float32)),
            }
            ids = {s.table: self._global_ids(step, s.table) for s in self.exchanged + self.row_wise + self.replicated}
            if self.exchanged:  # whole global batch
                batch["indices"], batch["offsets"] = _tbe_input(
                    [ids[s.table].ravel() for s in self.exchanged],
                    [np.full(B * W, s.shape.pooling_factor) for s in self.exchanged],
                )
                if self.overlap_slices > 1:  # each slice's bags, cut once per batch as a sliced loader would
                    ranges = producer_ranges(self.layout, r, self.overlap_slices)
                    batch["slices"] = tbe_bag_ranges(
                        batch["indices"], batch["offsets"], len(self.exchanged), B * W, ranges
                    )
            if self.row_wise:  # the global batch's ids in this rank's rows, shifted to the piece
                per_table, lengths = [], []
                for s in self.row_wise:
                    lo = self.first_row[(s.table, r)]
                    inside = (ids[s.table] >= lo) & (ids[s.table] < lo + s.shape.num_embeddings)
                    per_table.append(ids[s.table][inside] - lo)  # row-major: bag by bag
                    lengths.append(inside.sum(axis=1))
                batch["rw_indices"], batch["rw_offsets"] = _tbe_input(per_table, lengths)
            if self.replicated:  # this rank's own samples only
                mine = slice(r * B, (r + 1) * B)
                batch["dp_indices"], batch["dp_offsets"] = _tbe_input(
                    [ids[s.table][mine].ravel() for s in self.replicated],
                    [np.full(B, s.shape.pooling_factor) for s in self.replicated],
                )
            slices = batch.pop("slices", None)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            if slices is not None:
                batch["slices"] = {key: (i.to(self.device), o.to(self.device)) for key, (i, o) in slices.items()}
            out.append(batch)
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

    def _overlapped_exchange(self, slices: dict | None) -> torch.Tensor:
        """The lookup and the forward all-to-all overlapped in `overlap_slices` slices; the same
        [B, sum of widths] as `_exchange` of the whole lookup. A rank without tables still takes
        part (it receives, and sends zero-width rows that carry the backward exchange)."""
        B = self.spec.batch_size
        if self.tbe is not None:
            produce = lambda lo, hi: self.tbe(*slices[(lo, hi)])  # noqa: E731
        else:
            produce = lambda lo, hi: torch.zeros(hi - lo, 0, device=self.device, requires_grad=True)  # noqa: E731
        kept: list[torch.Tensor] = []
        received = overlapped_all_to_all(
            produce, self.layout, self.overlap_slices, keep=kept, dtype=torch.float32, device=self.device
        )
        recv = _JoinOverlappedExchange.apply(received, self.layout, self.overlap_slices, *kept)
        recv_sizes = [B * w for w in self.rank_width]
        parts = [p.view(B, w) for p, w in zip(torch.split(recv, recv_sizes), self.rank_width)]
        return torch.cat(parts, dim=1)

    def _embeddings(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        B, W = self.spec.batch_size, self.world
        parts = []
        if sum(self.rank_width):
            if self.overlap_slices > 1:
                parts.append(self._overlapped_exchange(batch.get("slices")))
            elif self.tbe is not None:
                pooled = self.tbe(batch["indices"], batch["offsets"])  # [W*B, width_r], sample-major
                parts.append(self._exchange(pooled))
            else:
                pooled = torch.zeros(W * B, 0, device=self.device, requires_grad=True)
                parts.append(self._exchange(pooled))
        if self.rw_tbe is not None:
            partial = self.rw_tbe(batch["rw_indices"], batch["rw_offsets"])  # [W*B, row-wise width]
            parts.append(_ReduceScatterSamples.apply(partial, W))
        if self.dp_tbe is not None:
            parts.append(self.dp_tbe(batch["dp_indices"], batch["dp_offsets"]))  # [B, replicated width]
        return torch.cat(parts, dim=1)

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        logits = self.dense(batch["dense"], self._embeddings(batch))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch["labels"])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduce, backward all-to-all / all-gather, TBE backward with fused SGD
        if self.dp_tbe is not None:  # the replicated tables' dense gradients, averaged like DDP's
            for p in self.dp_tbe.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(self.world)
        self.optimizer.step()
        return float(loss.detach())

    def run(self, iterations: int, warmup: int) -> RunResult:
        return run_timed_steps(
            lambda i: self.step(self.batches[i % len(self.batches)]), iterations, warmup, self.device
        )


def cycling_step(model: Any) -> Callable[[], float]:
    """A zero-argument training step of a `ShardedDLRM` that cycles through its batches."""
    batches = itertools.cycle(model.batches)
    return lambda: model.step(next(batches))

"""Overlapped compute + collective pairs: a producer kernel split into slices along the rows
its collective partitions, each slice's communication issued asynchronously as soon as the
slice is computed, so the transfer of early slices runs while later ones are still computed.

Three pairs, each with its unfused reference (produce everything, then one collective):
- embedding bag (FBGEMM TBE) + all-to-all: the pooled rows of the global batch go to the ranks
  owning their samples;
- GEMM / GEMV + all-reduce: the row-parallel linear of tensor parallelism;
- GEMM + all-to-all: an expert layer's output rows go to the ranks that routed their tokens.

All-to-all slices are point-to-point transfers (batched `isend` / `irecv`, any backend), computed in
communication-aware order: the producer's rows are walked starting at the next rank's block and
wrapping round, so rows for remote ranks are computed (and sent) first and the rank's own rows,
which need no transfer, last. A slice's sends and the matching receives of every source's slice
go in one batch (`probes.comm.exchange`), each receive straight into its final place in the
output, which has exactly `all_to_all_single`'s layout (per source rank, its rows for this rank,
sources in rank order), so fused and unfused outputs are comparable element for element and
the consumer cannot tell them apart. Splits may be uneven in rows (tokens per expert) and in
width (embedding dims per rank).

All-reduce slices are `all_reduce(async_op=True)` on row ranges of the output, written in place
by the GEMM (`out=`); when the output has fewer rows than slices (a GEMV), the product is sliced
along its columns into a transposed buffer instead.
"""

from __future__ import annotations

import importlib
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from probes.comm import comm_stream, exchange
from probes.vocabulary.pairs import ExchangeLayout, Piece, slice_bounds, slices_rows

# produce(lo, hi) -> rows lo..hi of the producer's output, [hi - lo, width]
Producer = Callable[[int, int], torch.Tensor]


def all_to_all_reference(produce: Producer, layout: ExchangeLayout, group=None) -> torch.Tensor:
    """Unfused: the whole producer output, then one `all_to_all_single` (uneven splits as the
    layout says)."""
    rank = dist.get_rank(group)
    y = produce(0, layout.rows(rank))
    recv = y.new_empty(sum(layout.recv_sizes(rank)))
    dist.all_to_all_single(
        recv, y.reshape(-1).contiguous(), layout.recv_sizes(rank), layout.send_sizes(rank), group=group
    )
    return recv


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def overlapped_all_to_all(
    produce: Producer,
    layout: ExchangeLayout,
    k: int,
    group=None,
    keep: list[torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Fused: `k` slices of the producer in remote-first order, each slice's remote pieces sent
    as soon as it is computed, every piece received straight into the output's final layout.
    Slice t's sends and the receives of every source's slice t go in one `batch_isend_irecv`
    (batches in slice order on every rank, so NCCL, which ignores tags, pairs them and cannot
    deadlock), issued from the communication stream on CUDA. `keep`, when given, collects each
    slice's producer output (for autograd callers)."""
    rank, world = dist.get_rank(group), layout.world
    width = layout.widths[rank]
    out = torch.empty(sum(layout.recv_sizes(rank)), dtype=dtype, device=device)
    batches = max(len(layout.slices(s, k)) for s in range(world))  # the same count on every rank
    receives: list[list[tuple[str, torch.Tensor, int]]] = [[] for _ in range(batches)]
    for s in range(world):
        if s == rank:
            continue
        base = layout.recv_offset(s, rank)
        for t, pieces in enumerate(layout.slices(s, k)):
            for p in pieces:
                if p.dest == rank:
                    a = base + p.dest_lo * layout.widths[s]
                    b = a + (p.hi - p.lo) * layout.widths[s]
                    if b > a:  # a rank without exchanged columns sends nothing
                        receives[t].append(("recv", out[a:b], _global(group, s)))
    own_base = layout.recv_offset(rank, rank)
    mine = layout.slices(rank, k)
    works = []
    for t in range(batches):
        sends: list[tuple[str, torch.Tensor, int]] = []
        if t < len(mine):
            y = _produce_pieces(produce, mine[t])
            if keep is not None:
                keep.append(y)
            y = y.detach()
            row = 0
            for p in mine[t]:
                n = p.hi - p.lo
                part = y[row : row + n]
                row += n
                if p.dest == rank:
                    out[own_base + p.dest_lo * width : own_base + (p.dest_lo + n) * width].copy_(part.reshape(-1))
                elif part.numel():
                    sends.append(("send", part.contiguous().reshape(-1), _global(group, p.dest)))
        with comm_stream(out.device):
            works += exchange(receives[t] + sends, group, tag=t)
    for w in works:
        w.wait()
    return out


def _runs(pieces: Sequence[Piece]) -> list[tuple[int, int]]:
    """A slice's producer rows as contiguous runs, in piece order (a slice that wraps from the
    last rank's block to rank 0's makes two)."""
    runs: list[list[int]] = []
    for p in pieces:
        if runs and runs[-1][1] == p.lo:
            runs[-1][1] = p.hi
        else:
            runs.append([p.lo, p.hi])
    return [(a, b) for a, b in runs]


def _produce_pieces(produce: Producer, pieces: Sequence[Piece]) -> torch.Tensor:
    """The producer rows of one slice, in the slice's piece order: one call per run."""
    parts = [produce(a, b) for a, b in _runs(pieces)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def gemm_all_reduce_reference(x: torch.Tensor, weight: torch.Tensor, group=None) -> torch.Tensor:
    """Unfused row-parallel linear: x @ weight, then one all-reduce."""
    out = x @ weight
    dist.all_reduce(out, group=group)
    return out


def overlapped_gemm_all_reduce(x: torch.Tensor, weight: torch.Tensor, k: int, group=None) -> torch.Tensor:
    """Fused: the product in `k` slices, each all-reduced asynchronously as soon as it is
    written. Slices run along rows, or, for a GEMV or a few-row product whose row slices
    would each re-read the whole weight (`slices_rows`), along columns through a transposed
    buffer so every slice stays contiguous."""
    m, n = x.shape[0], weight.shape[1]
    works = []
    if slices_rows(m, n, x.shape[1], k):
        out = x.new_empty(m, n)
        for a, b in slice_bounds(m, k):
            torch.mm(x[a:b], weight, out=out[a:b])
            with comm_stream(out.device):
                works.append(dist.all_reduce(out[a:b], group=group, async_op=True))
        for w in works:
            w.wait()
        return out
    out_t = x.new_empty(n, m)
    for a, b in slice_bounds(n, k):
        # x @ weight[:, a:b] reads the weight in its own layout (a product over a transposed,
        # strided weight view is an order of magnitude slower on CPU), then lands transposed.
        out_t[a:b].copy_((x @ weight[:, a:b]).t())
        with comm_stream(out_t.device):
            works.append(dist.all_reduce(out_t[a:b], group=group, async_op=True))
    for w in works:
        w.wait()
    return out_t.t()


def symm_mem_supported(device: torch.device | str, rows: int, world: int) -> bool:
    """Whether PyTorch's symmetric-memory fused matmul + reduce-scatter can run the pair here:
    CUDA, the op registered in this PyTorch, and rows that split evenly over the group."""
    if torch.device(device).type != "cuda" or rows % max(world, 1):
        return False
    try:
        importlib.import_module("torch.distributed._symmetric_memory")  # registers torch.ops.symm_mem
    except ImportError:
        return False
    return hasattr(torch.ops, "symm_mem") and hasattr(torch.ops.symm_mem, "fused_matmul_reduce_scatter")


def symm_mem_gemm_all_reduce(x: torch.Tensor, weight: torch.Tensor, group=None) -> torch.Tensor:
    """The row-parallel pair as PyTorch's own fused kernels run it: symmetric-memory
    `fused_matmul_reduce_scatter` (the product micro-pipelined with its reduce-scatter), then an
    all-gather of the reduced rows, equal to x @ weight all-reduced. CUDA only (see
    `symm_mem_supported`); a candidate beside the sliced form, measured by the pair probe."""
    group = group or dist.group.WORLD
    scattered = torch.ops.symm_mem.fused_matmul_reduce_scatter(x, weight, "sum", 0, group.group_name)
    out = scattered.new_empty(x.shape[0], weight.shape[1])
    dist.all_gather_into_tensor(out, scattered.contiguous(), group=group)
    return out


def sliced_all_reduce(out: torch.Tensor, k: int, group=None) -> torch.Tensor:
    """The communication of `overlapped_gemm_all_reduce` alone: `k` asynchronous all-reduces
    of near-equal contiguous slices of `out`, all in flight before the first wait (the
    transfer-only form its cost model is calibrated on)."""
    flat = out.view(-1)
    with comm_stream(out.device):
        works = [dist.all_reduce(flat[a:b], group=group, async_op=True) for a, b in slice_bounds(flat.numel(), k)]
    for w in works:
        w.wait()
    return out


def gemm_producer(x: torch.Tensor, weight: torch.Tensor) -> Producer:
    """Rows lo..hi of x @ weight (an expert's output for those tokens)."""
    return lambda lo, hi: x[lo:hi] @ weight


def tbe_bag_ranges(
    indices: torch.Tensor, offsets: torch.Tensor, num_tables: int, bags: int, ranges: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """TBE inputs restricted to bags lo..hi of every table, for each range. TBE's layout is
    table-major (offsets[t * bags + b]), so a bag range is one run per table; done once per
    batch, as a data loader that emits sliced batches would."""
    off = offsets.to(torch.int64)
    out = {}
    for lo, hi in ranges:
        idx_parts, lengths = [], []
        for t in range(num_tables):
            a, b = int(off[t * bags + lo]), int(off[t * bags + hi])
            idx_parts.append(indices[a:b])
            lengths.append(off[t * bags + lo + 1 : t * bags + hi + 1] - off[t * bags + lo : t * bags + hi])
        new_offsets = torch.cat(
            [torch.zeros(1, dtype=torch.int64, device=off.device), torch.cumsum(torch.cat(lengths), 0)]
        )
        out[(lo, hi)] = (torch.cat(idx_parts).to(indices.dtype), new_offsets.to(offsets.dtype))
    return out


def producer_ranges(layout: ExchangeLayout, rank: int, k: int) -> list[tuple[int, int]]:
    """Every producer call `overlapped_all_to_all` makes for `rank` with `k` slices (and the
    whole range, for the unfused form)."""
    ranges = [(0, layout.rows(rank))]
    for pieces in layout.slices(rank, k):
        ranges += _runs(pieces)
    return ranges


def slice_runs(layout: ExchangeLayout, rank: int, k: int) -> list[list[tuple[int, int]]]:
    """Per slice of `rank`'s `k`, the producer row runs `overlapped_all_to_all` computes, in
    the order its `keep` list holds them (a slice's rows are the runs concatenated)."""
    return [_runs(pieces) for pieces in layout.slices(rank, k)]


def tbe_producer(tbe: torch.nn.Module, inputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]) -> Producer:
    """Pooled embeddings of bags lo..hi from a TBE and inputs prepared by `tbe_bag_ranges`."""

    def produce(lo: int, hi: int) -> torch.Tensor:
        indices, offsets = inputs[(lo, hi)]
        return tbe(indices, offsets)

    return produce

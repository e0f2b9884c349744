"""A hierarchical, chunked all-reduce over `torch.distributed` subgroups that runs any per-chunk
dimension schedule (Themis's or the fixed baseline order), and a DDP communication hook using it.

Ranks are laid out on a D-dimensional grid, dimension 0 varying fastest (consecutive ranks
share a node, so dimension 0 is the intra-node one). One process group per line of the grid
per dimension. A chunk is reduce-scattered through the dimensions in its own order, which
leaves every rank with the fully reduced 1/world share it owns, then all-gathered back in the
reverse order. Which order each chunk takes, and the order in which ranks issue the stages,
is data (`ChunkSchedule`), chosen by the chunk policy; this module only executes it, so a
schedule that the simulator says is fast is the one that really runs.

The DDP hook is asynchronous: it hands the bucket to one communication thread per reducer and
returns a future at once, so backward goes on computing the next buckets while this one is
reduced (as DDP's own all-reduce does). One thread keeps every rank issuing the stages of all
buckets in one order (DDP fires bucket hooks in the same order on every rank, and a stage may
only be issued after the stage before it in its chunk has finished), which chained callbacks
would not: their order would follow each rank's own timing.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import torch
import torch.distributed as dist

from probes.comm import all_gather_single, reduce_scatter_single
from probes.vocabulary.chunks import ChunkSchedule, ScheduleError, dimension_lines, rank_coords


class HierarchicalAllReduce:
    """The subgroups of a rank grid and a schedule that runs on them. Build it on every rank of
    the default group, in the same order (torch.distributed creates groups collectively)."""

    def __init__(self, dims: Sequence[int], schedule: ChunkSchedule):
        world = dist.get_world_size()
        if math.prod(dims) != world:
            raise ScheduleError(f"grid {tuple(dims)} holds {math.prod(dims)} ranks, the process group has {world}")
        if tuple(schedule.dims) != tuple(dims):
            raise ScheduleError(f"schedule is for grid {schedule.dims}, not {tuple(dims)}")
        self.dims, self.schedule = tuple(int(p) for p in dims), schedule
        self.rank = dist.get_rank()
        self.coords = rank_coords(self.rank, self.dims)
        self.groups: list[Any] = []
        for d in range(len(self.dims)):
            mine = None
            for line in dimension_lines(self.dims, d):
                group = dist.new_group(list(line)) if len(line) > 1 else None
                if self.rank in line:
                    mine = group
            self.groups.append(mine)
        self._thread: ThreadPoolExecutor | None = None

    def _stage(self, buf: torch.Tensor, dim: int, phase: str) -> tuple[torch.Tensor, Any]:
        p = self.dims[dim]
        if p == 1:
            return buf, None
        if phase == "rs":
            out = torch.empty(buf.numel() // p, dtype=buf.dtype, device=buf.device)
            work = reduce_scatter_single(out, buf, group=self.groups[dim], async_op=True)
        else:
            out = torch.empty(buf.numel() * p, dtype=buf.dtype, device=buf.device)
            work = all_gather_single(out, buf, group=self.groups[dim], async_op=True)
        return out, work

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over all ranks in place, chunk by chunk as the schedule says."""
        flat = tensor.view(-1)
        n, world, chunks = flat.numel(), self.schedule.world_size, self.schedule.chunks
        per_chunk = max(1, math.ceil(n / (chunks * world))) * world  # every stage splits evenly
        padded = torch.zeros(per_chunk * chunks, dtype=flat.dtype, device=flat.device)
        padded[:n] = flat
        bufs: list[torch.Tensor] = list(padded.split(per_chunk))
        pending: list[Any] = [None] * chunks
        for chunk, stage in self.schedule.issue:
            if pending[chunk] is not None:
                pending[chunk].wait()  # a stage consumes the previous stage's output
            dim, phase = self.schedule.stage_dim(chunk, stage)
            bufs[chunk], pending[chunk] = self._stage(bufs[chunk], dim, phase)
        for work in pending:
            if work is not None:
                work.wait()
        flat.copy_(torch.cat(bufs)[:n])
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor) -> torch.futures.Future:
        """`all_reduce_` on the reducer's communication thread; the future completes with
        `tensor`, summed, or with the error the reduction raised."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunked-allreduce")
        future: torch.futures.Future = torch.futures.Future()

        def reduce() -> None:
            try:
                if tensor.is_cuda:
                    torch.cuda.set_device(tensor.device)  # the thread's collectives on the bucket's device
                future.set_result(self.all_reduce_(tensor))
            except Exception as exc:  # DDP raises it where it waits for the bucket
                future.set_exception(exc)

        self._thread.submit(reduce)
        return future


def hierarchical_allreduce_hook(state, bucket):  # annotations set below, as objects
    """DDP communication hook: average the bucket's gradients with the hierarchical schedule,
    off the backward thread (the future chain: reduce, then divide).
    Register with `ddp_model.register_comm_hook(HierarchicalAllReduce(dims, schedule), hook)`."""
    world = state.schedule.world_size
    return state.all_reduce_async(bucket.buffer()).then(lambda done: done.value().div_(world))


# DDP checks a hook's annotations against the real types; with postponed evaluation (PEP 563)
# they would be strings, so they are set as objects here.
hierarchical_allreduce_hook.__annotations__ = {
    "state": HierarchicalAllReduce,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def chunked_comm_hook(schedule: dict[str, Any]) -> tuple[HierarchicalAllReduce, Any]:
    """(state, hook) for `DistributedDataParallel.register_comm_hook` that all-reduces each
    bucket by a plan's chunk schedule (a `ChunkSchedule` as a dict)."""
    chunks = ChunkSchedule.from_dict(schedule)
    return HierarchicalAllReduce(chunks.dims, chunks), hierarchical_allreduce_hook

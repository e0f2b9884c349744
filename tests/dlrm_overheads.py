"""Test helpers for the overhead probe: the DLRM step profiled in one process (a world of one
unless a group exists)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from probes.overheads import profile_overheads
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.records import Measurement
from probes.workloads.dlrm import ShardedDLRM, cycling_step


def dlrm_overhead_step(
    job_dict: dict[str, Any], device: str = "cpu", table_to_rank: Sequence[int] | None = None
) -> Callable[[], float]:
    """A real DLRM training step (TBEs, all-to-all, DDP MLPs, SGD) on the *current* process
    group, ready for `profile_overheads`.

    The group must already be initialised (a gang's, or `local_process_group()` for one
    process); every rank must then call the step the same number of times. `table_to_rank`
    defaults to round-robin over the group.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "dlrm_overhead_step needs an initialised process group; "
            "wrap it in local_process_group() for a single process"
        )
    job = JobSpec.from_dict(job_dict)
    rank, world = dist.get_rank(), dist.get_world_size()
    placement = list(table_to_rank) if table_to_rank is not None else [i % world for i in range(len(job.tables))]
    return cycling_step(ShardedDLRM(job, placement, rank, world, torch.device(device)))


@contextmanager
def local_process_group(backend: str = "gloo") -> Iterator[bool]:
    """A world-of-one process group (FileStore in a temp dir) if none is initialised yet.

    Yields whether it created the group; only a group it created is destroyed on exit.
    """
    if dist.is_initialized():
        yield False
        return
    with tempfile.TemporaryDirectory(prefix="overheads-pg-") as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield True
        finally:
            dist.destroy_process_group()


def profile_dlrm_overheads(
    job_dict: dict[str, Any],
    device: str = "cpu",
    iterations: int = 5,
    warmup: int = 3,
    trace_path: str | None = None,
    table_to_rank: Sequence[int] | None = None,
) -> list[Measurement]:
    """Overheads of the DLRM step in this process alone (a world of one unless a group exists)."""
    with local_process_group("nccl" if torch.device(device).type == "cuda" else "gloo"):
        step = dlrm_overhead_step(job_dict, device, table_to_rank)
        return profile_overheads(step, iterations, warmup, device, trace_path, workload="dlrm")

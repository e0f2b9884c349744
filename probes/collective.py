"""Collective probes, run by every member of an initialised torch.distributed group.

Each member times the op; the group's time for a point is the slowest member's median (a
collective is done when its last member is). Only rank 0 returns rows. Bandwidths follow the
nccl-tests conventions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from probes.records import Measurement
from probes.timing import time_callable

COLLECTIVE_OPS = ("all_reduce", "all_to_all")


def bus_bandwidth(op: str, nbytes: float, seconds: float, world: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s."""
    alg = nbytes / seconds if seconds > 0 else 0.0
    if op == "all_reduce":
        return alg, alg * 2 * (world - 1) / world
    return alg, alg * (world - 1) / world


def collective_params(op: str, nbytes: int, world: int, scope: str = "intra") -> dict:
    """`bytes` is the per-rank message: the tensor all-reduced, or the largest per-rank send."""
    return {"op": op, "bytes": int(nbytes), "world": int(world), "scope": scope}


def measure_collective(
    op: str,
    nbytes: int,
    device: torch.device | str = "cpu",
    scope: str = "intra",
    target_s: float = 0.2,
) -> list[Measurement]:
    """Time `op` on a message of `nbytes` per rank (float32, rounded to a multiple of world)."""
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {COLLECTIVE_OPS}")
    device = torch.device(device)
    world, rank = dist.get_world_size(), dist.get_rank()
    numel = max(world, (int(nbytes) // 4) // world * world)
    x = torch.randn(numel, device=device)
    out = torch.empty_like(x)

    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x)  # noqa: E731
    else:
        fn = lambda: dist.all_to_all_single(out, x)  # noqa: E731

    def step() -> None:
        fn()

    # Everyone must run the same number of repeats: size the count from a few warm-up runs
    # (about `target_s` of work, 11..201 repeats) and agree on the largest across ranks.
    dist.barrier()
    probe = time_callable(step, device=device, warmup=3, min_repeats=3, max_repeats=3, max_seconds=1e9)
    want = torch.tensor([min(max(int(target_s / max(probe.median_s, 1e-7)), 11), 201)])
    dist.all_reduce(want, op=dist.ReduceOp.MAX)
    repeats = int(want)
    dist.barrier()
    t = time_callable(step, device=device, warmup=0, min_repeats=repeats, max_repeats=repeats, max_seconds=1e9)
    slowest = torch.tensor([t.median_s, t.spread_s], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank != 0:
        return []
    median, spread = float(slowest[0]), float(slowest[1])
    real_bytes = numel * 4
    alg, bus = bus_bandwidth(op, real_bytes, median, world)
    return [
        Measurement(
            op,
            collective_params(op, real_bytes, world, scope),
            median,
            spread,
            t.repeats,
            device=str(device),
            world_size=world,
            family="collective",
            extra={"alg_bw": alg, "bus_bw": bus},
        )
    ]

"""Collective probes, run by every member of an initialised torch.distributed group.

A point may run on a subgroup (`ranks`) of the default group, to measure every group size
from 2 to the world; every process must still call the probe, because creating a subgroup is
itself collective over the default group. Each member times the op; the group's time for a
point is the slowest member's median (a collective is done when its last member is). Only the
subgroup's first rank returns rows.

A point is timed in several short windows and reported as the median of the window medians:
on a busy host (loopback gloo on a few cores) a single window's median moves by 10-30% with
scheduling, and the median of windows removes a disturbed one instead of recording it.

Sizes and bandwidths follow the nccl-tests conventions: `bytes` is the large buffer of the op
(the all-reduced or broadcast tensor, all_gather's output, reduce_scatter's input, a rank's
all-to-all send buffer). For an uneven all-to-all it is the largest per-rank send or receive,
the size that bounds its time.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from probes.records import Measurement
from probes.timing import time_callable

COLLECTIVE_OPS = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")
_ELEMENT = 4  # float32
_subgroups: dict[tuple[int, ...], object] = {}


def bus_bandwidth(op: str, nbytes: float, seconds: float, world: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s."""
    alg = nbytes / seconds if seconds > 0 else 0.0
    if op == "all_reduce":
        return alg, alg * 2 * (world - 1) / world
    if op == "broadcast":
        return alg, alg
    return alg, alg * (world - 1) / world


def collective_params(op: str, nbytes: int, world: int, scope: str = "intra", uneven: bool = False) -> dict:
    params = {"op": op, "bytes": int(nbytes), "world": int(world), "scope": scope}
    if uneven:
        params["uneven"] = True
    return params


def group_for(ranks: Sequence[int] | None):
    """The process group over `ranks` (None: the default group), created once per ranks set.

    Every process of the default group must call this with the same `ranks`."""
    world = dist.get_world_size()
    if ranks is None or tuple(ranks) == tuple(range(world)):
        return None
    key = tuple(int(r) for r in ranks)
    if key not in _subgroups:
        _subgroups[key] = dist.new_group(list(key))
    return _subgroups[key]


def forget_groups() -> None:
    """Drop cached subgroups (call before destroying the default group)."""
    _subgroups.clear()


def uneven_splits(numel: int, n: int, seed: int, skew: float = 0.6) -> np.ndarray:
    """S[i, j]: elements rank i sends to rank j; log-normal skew around numel / n per pair,
    the same on every rank for a given seed (as a skewed embedding all-to-all is)."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, skew, size=(n, n))
    return np.maximum(1, np.round(weights / weights.mean() * numel / n)).astype(np.int64)


def _op_call(op: str, numel: int, n: int, pos: int, group, device: torch.device, src: int,
             splits: np.ndarray | None) -> Callable[[], object]:
    rand = lambda k: torch.randn(int(k), device=device)  # noqa: E731
    if op == "all_reduce":
        x = rand(numel)
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        x = rand(numel)
        return lambda: dist.broadcast(x, src=src, group=group)
    if op == "all_gather":
        inp, out = rand(numel // n), torch.empty(numel, device=device)
        return lambda: dist.all_gather_single(out, inp, group=group)
    if op == "reduce_scatter":
        inp, out = rand(numel), torch.empty(numel // n, device=device)
        return lambda: dist.reduce_scatter_single(out, inp, group=group)
    if splits is None:
        inp, out = rand(numel), torch.empty(numel, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    send, recv = splits[pos].tolist(), splits[:, pos].tolist()
    inp, out = rand(sum(send)), torch.empty(int(sum(recv)), device=device)
    return lambda: dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=group)


def message_numel(nbytes: int, group_size: int) -> int:
    """Elements of a `nbytes` float32 message as measured on a group of `group_size`: a
    multiple of the group size (every rank gets an equal share), at least one per rank."""
    return max(group_size, (int(nbytes) // _ELEMENT) // group_size * group_size)


def measure_collective(
    op: str,
    nbytes: int,
    device: torch.device | str = "cpu",
    scope: str = "intra",
    target_s: float = 0.2,
    ranks: Sequence[int] | None = None,
    uneven: bool = False,
    seed: int = 0,
    windows: int = 5,
) -> list[Measurement]:
    """Time `op` on a `nbytes` buffer (float32, rounded to a multiple of the group size) over
    `ranks` (default: every rank). `uneven` (all_to_all only) draws skewed per-pair splits.
    The repeats are split into `windows` windows; per window the slowest member's median
    counts, and the row's time is the median over windows (spread: their interquartile range)."""
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {COLLECTIVE_OPS}")
    if uneven and op != "all_to_all":
        raise ValueError(f"uneven splits apply to all_to_all only, not {op!r}")
    device = torch.device(device)
    members = list(ranks) if ranks is not None else list(range(dist.get_world_size()))
    group = group_for(ranks)
    rank = dist.get_rank()
    if rank not in members:
        return []
    n, pos = len(members), members.index(rank)
    numel = message_numel(nbytes, n)
    splits = uneven_splits(numel, n, seed) if uneven else None
    fn = _op_call(op, numel, n, pos, group, device, members[0], splits)

    # Everyone must run the same number of repeats: size the count from a few warm-up runs
    # (about `target_s` of work, 11..201 repeats) and agree on the largest across members.
    dist.barrier(group=group)
    probe = time_callable(fn, device=device, warmup=3, min_repeats=3, max_repeats=3, max_seconds=1e9,
                          min_sample_s=0.0)
    want = torch.tensor([min(max(int(target_s / max(probe.median_s, 1e-7)), 11), 201)])
    dist.all_reduce(want, op=dist.ReduceOp.MAX, group=group)
    windows = max(1, min(int(windows), int(want) // 3))
    per_window = max(3, -(-int(want) // windows))
    medians = torch.zeros(windows, dtype=torch.float64)
    for w in range(windows):
        dist.barrier(group=group)
        t = time_callable(fn, device=device, warmup=0, min_repeats=per_window, max_repeats=per_window,
                          max_seconds=1e9)
        medians[w] = t.median_s
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)  # per window: the slowest member
    if pos != 0:
        return []
    window_medians = medians.numpy()
    median = float(np.median(window_medians))
    q1, q3 = np.percentile(window_medians, [25, 75])
    spread = float(q3 - q1)
    if splits is not None:
        real_bytes = int(max(splits.sum(axis=1).max(), splits.sum(axis=0).max())) * _ELEMENT
    else:
        real_bytes = numel * _ELEMENT
    alg, bus = bus_bandwidth(op, real_bytes, median, n)
    extra = {"alg_bw": alg, "bus_bw": bus, "ranks": members}
    if splits is not None:
        extra["splits"] = splits.tolist()
    extra["window_medians"] = window_medians.tolist()
    return [
        Measurement(op, collective_params(op, real_bytes, n, scope, uneven), median, spread, windows * per_window,
                    device=str(device), world_size=n, family="collective", extra=extra)
    ]

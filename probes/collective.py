"""Collective probes, run by every member of an initialised torch.distributed group.

A point may run on a subgroup (`ranks`) of the default group, to measure every group size
from 2 to the world; every process must still call the probe, because creating a subgroup is
itself collective over the default group. Each member times the op; the group's time for a
point is the slowest member's median (a collective is done when its last member is). Only the
subgroup's first rank returns rows.

A point is timed in several short windows and reported as the mean of the faster half of its
window medians (`window_estimate`): on a busy host (loopback gloo on a few cores) a single
window's median moves by 10-30% with scheduling, and that noise is one-sided (interference only
ever slows a window), so the slower half of the windows is dropped instead of recorded. Points
are measured in batches whose windows are interleaved, so that a point's windows are spread
over seconds rather than consecutive: a long burst of noise then spoils one window of many
points rather than all windows of one.

Sizes and bandwidths follow the nccl-tests conventions: `bytes` is the large buffer of the op
(the all-reduced or broadcast tensor, all_gather's output, reduce_scatter's input, a rank's
all-to-all send buffer). For an uneven all-to-all it is the largest per-rank send or receive,
the size that bounds its time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from probes.comm import all_gather_single, destroy_groups, on_host, reduce_scatter_single
from probes.timing import time_callable
from probes.vocabulary.ops import bus_bandwidth, collective_params, uneven_splits
from probes.vocabulary.records import Measurement

COLLECTIVE_OPS = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")
_ELEMENT = 4  # float32
# A point's timing budget in one visit: about TARGET_S of repeats, MIN..MAX_REPEATS of them.
TARGET_S, MIN_REPEATS, MAX_REPEATS = 0.2, 11, 201
_subgroups: dict[tuple[int, ...], object] = {}


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
    """Destroy the cached subgroups (call before destroying the default group): each NCCL
    communicator holds device buffers until destroyed."""
    destroy_groups(list(_subgroups.values()))
    _subgroups.clear()


def _op_call(
    op: str, numel: int, n: int, pos: int, group, device: torch.device, src: int, splits: np.ndarray | None
) -> Callable[[], object]:
    rand = lambda k: torch.randn(int(k), device=device)  # noqa: E731
    if op == "all_reduce":
        x = rand(numel)
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        x = rand(numel)
        return lambda: dist.broadcast(x, src=src, group=group)
    if op == "all_gather":
        inp, out = rand(numel // n), torch.empty(numel, device=device)
        return lambda: all_gather_single(out, inp, group=group)
    if op == "reduce_scatter":
        inp, out = rand(numel), torch.empty(numel // n, device=device)
        return lambda: reduce_scatter_single(out, inp, group=group)
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


@dataclass(frozen=True)
class CollectivePoint:
    """One collective to time: `op` on a `nbytes` float32 buffer over `ranks` (None: all)."""

    op: str
    nbytes: int
    scope: str = "intra"
    ranks: tuple[int, ...] | None = None
    uneven: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVE_OPS:
            raise ValueError(f"unknown collective {self.op!r}; expected one of {COLLECTIVE_OPS}")
        if self.uneven and self.op != "all_to_all":
            raise ValueError(f"uneven splits apply to all_to_all only, not {self.op!r}")


def measure_collective(
    op: str,
    nbytes: int,
    device: torch.device | str = "cpu",
    scope: str = "intra",
    target_s: float = TARGET_S,
    ranks: Sequence[int] | None = None,
    uneven: bool = False,
    seed: int = 0,
    windows: int = 5,
) -> list[Measurement]:
    """Time one collective point (see `measure_collectives`)."""
    point = CollectivePoint(op, int(nbytes), scope, tuple(ranks) if ranks is not None else None, uneven, seed)
    return measure_collectives([point], device, target_s, windows)


def measure_collectives(
    points: Sequence[CollectivePoint],
    device: torch.device | str = "cpu",
    target_s: float = TARGET_S,
    windows: int = 5,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
    warmup: int = 3,
    stop_at: float | None = None,
    group: Any = None,
) -> list[Measurement]:
    """Time a batch of collective points over one rank group, their windows interleaved.

    Each point gets about `target_s` of repeats (`min_repeats`..`max_repeats`, after `warmup`
    untimed runs and two sizing runs), split into `windows` windows; per
    window the slowest member's median counts, and a point's time is the median over its
    windows (spread: their interquartile range). The windows run round-robin over the batch
    (window 1 of every point, then window 2, ...), so one point's windows lie a whole batch
    round apart: a burst of host noise (hundreds of ms on a shared VM) lands in one window of
    several points, where the median drops it, instead of in every window of one point,
    where it would be recorded as that point's time.

    `stop_at` (epoch seconds): before every point's sizing and every window the members agree
    whether any of them is past it, and if so all stop there together, so a batch cut by its phase's deadline ends
    cleanly instead of being killed (a killed probe actor takes tens of seconds to replace on a
    loaded host). Points with at least one window get a row, a prefix of `points` in their
    order; the rest are left unmeasured.

    `uneven` (all_to_all only) draws skewed per-pair splits. Every process of the default
    group must call this with the same points; only the group's first rank returns rows, one
    per measured point, in the order of `points`. `group`: the process group over the points'
    ranks, made by the caller (under forced NCCL settings, `probes.nccl_choice`); unset, the
    cached one (`group_for`)."""
    if not points:
        return []
    groups = {p.ranks for p in points}
    if len(groups) != 1:
        raise ValueError(f"a collective batch runs on one rank group; got {sorted(map(str, groups))}")
    ranks = points[0].ranks
    device = torch.device(device)
    members = list(ranks) if ranks is not None else list(range(dist.get_world_size()))
    group = group_for(ranks) if group is None else group
    rank = dist.get_rank()
    if rank not in members:
        return []
    n, pos = len(members), members.index(rank)
    numels = [message_numel(p.nbytes, n) for p in points]
    splits = [uneven_splits(numel, n, p.seed) if p.uneven else None for p, numel in zip(points, numels)]
    fns = [_op_call(p.op, numel, n, pos, group, device, members[0], s) for p, numel, s in zip(points, numels, splits)]

    agreed = _agreed_repeats(fns, group, device, (target_s, min_repeats, max_repeats, warmup), stop_at)
    if not agreed:  # every member found the deadline passed before the first point was sized
        return []
    n_windows = [max(1, min(int(windows), w // 2)) for w in agreed]
    per_window = [max(2, -(-w // k)) for w, k in zip(agreed, n_windows)]
    medians = torch.zeros(len(agreed), max(n_windows), dtype=torch.float64, device=device)
    done = [0] * len(agreed)  # windows timed per sized point
    for w, i in ((w, i) for w in range(max(n_windows)) for i in range(len(agreed)) if w < n_windows[i]):
        if _anyone_past(stop_at, group, device):  # doubles as the barrier before the window
            break
        t = time_callable(
            fns[i], device=device, warmup=0, min_repeats=per_window[i], max_repeats=per_window[i], max_seconds=1e9
        )
        medians[i, w] = t.median_s
        done[i] += 1
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)  # per window: the slowest member
    if pos != 0:
        return []
    medians = on_host(medians)
    return [
        _row(p, numel, s, medians[i, : done[i]].numpy(), done[i] * per_window[i], n, members, device)
        for i, (p, numel, s) in enumerate(zip(points[: len(agreed)], numels, splits))
        if done[i]
    ]


def _agreed_repeats(
    fns: Sequence[Callable[[], object]],
    group: object,
    device: torch.device,
    sizing: tuple[float, int, int, int],
    stop_at: float | None,
) -> list[int]:
    """Repeats per point: everyone must run the same number, so each member sizes every
    point's count from a few warm-up runs (about `target_s` of work, within `min_repeats`..
    `max_repeats`, after `warmup` runs: `sizing`) and the group agrees on the largest. Before
    each point the members agree whether one is past `stop_at`: then only the points sized so
    far are measured (a batch of large messages on a loaded host can take longer to size than
    its phase has left)."""
    target_s, min_repeats, max_repeats, warmup = sizing
    wants: list[int] = []
    for i, fn in enumerate(fns):
        if (i == 0 or stop_at is not None) and _anyone_past(stop_at, group, device):
            break
        probe = time_callable(
            fn, device=device, warmup=warmup, min_repeats=2, max_repeats=2, max_seconds=1e9, min_sample_s=0.0
        )
        wants.append(min(max(int(target_s / max(probe.median_s, 1e-7)), min_repeats), max_repeats))
    if not wants:
        return []
    want = torch.tensor(wants, dtype=torch.int64, device=device)  # on the group's device (probes.comm)
    dist.all_reduce(want, op=dist.ReduceOp.MAX, group=group)
    return [int(w) for w in want.tolist()]


def _anyone_past(stop_at: float | None, group: object, device: torch.device) -> bool:
    """Whether any member of `group` is past `stop_at` (epoch seconds; clocks of a cluster's
    nodes agree to well under a window), asked of every member at once so that all give the
    same answer; a plain barrier when there is no `stop_at`."""
    if stop_at is None:
        dist.barrier(group=group)
        return False
    late = torch.tensor([int(time.time() >= stop_at)], dtype=torch.int32, device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX, group=group)
    return bool(late.item())


def window_estimate(window_medians: Sequence[float]) -> float:
    """A point's time from its window medians: the mean of the faster half (at least one).

    Host interference on a shared machine only adds time, so the distribution of window medians
    is the quiet latency plus a one-sided tail; the median still moves with how many windows a
    slow spell hit (in one 3-pass calibration 21 of 75 small all_reduce visits ran over 1.8x
    their size's fastest), while the minimum rests on one window. Averaging the faster half keeps
    the quiet level with the variance of several windows. How much in-step contention adds back
    is the in-context model's job (`predictors.context_model`), fitted on whole training steps.
    """
    w = np.sort(np.asarray(window_medians, dtype=np.float64))
    return float(w[: max(1, len(w) // 2)].mean())


def _row(
    point: CollectivePoint,
    numel: int,
    splits: np.ndarray | None,
    window_medians: np.ndarray,
    repeats: int,
    n: int,
    members: list[int],
    device: torch.device,
) -> Measurement:
    median = window_estimate(window_medians)
    q1, q3 = np.percentile(window_medians, [25, 75])
    if splits is not None:
        real_bytes = int(max(splits.sum(axis=1).max(), splits.sum(axis=0).max())) * _ELEMENT
    else:
        real_bytes = numel * _ELEMENT
    alg, bus = bus_bandwidth(point.op, real_bytes, median, n)
    extra = {"alg_bw": alg, "bus_bw": bus, "ranks": members}
    if splits is not None:
        extra["splits"] = splits.tolist()
    extra["window_medians"] = window_medians.tolist()
    params = collective_params(point.op, real_bytes, n, point.scope, point.uneven)
    return Measurement(
        point.op,
        params,
        median,
        float(q3 - q1),
        repeats,
        device=str(device),
        world_size=n,
        family="collective",
        extra=extra,
    )


def merge_passes(rows: Sequence[Measurement]) -> list[Measurement]:
    """One row per collective point: a point measured in several passes of a sweep (see
    `run_collective_probes`) is merged into the first row, its time the `window_estimate` of
    every pass's window medians. A sweep's passes lie tens of seconds apart, so the merged point
    spans the host's slow drifts (+-25% over tens of seconds on a shared VM) instead of
    recording whichever level its one visit met. Other rows pass through in order."""
    merged: list[Measurement] = []
    first: dict[tuple, Measurement] = {}
    for row in rows:
        if row.family != "collective" or "window_medians" not in row.extra:
            merged.append(row)
            continue
        key = (row.op, json.dumps(row.params, sort_keys=True), tuple(row.extra.get("ranks", ())), row.node)
        if key not in first:
            first[key] = Measurement(
                row.op,
                dict(row.params),
                row.median_s,
                row.spread_s,
                row.repeats,
                row.device,
                row.world_size,
                row.hardware_id,
                row.node,
                row.family,
                {**row.extra, "window_medians": list(row.extra["window_medians"]), "passes": 1},
            )
            merged.append(first[key])
            continue
        into = first[key]
        windows = np.asarray(into.extra["window_medians"] + list(row.extra["window_medians"]), dtype=np.float64)
        q1, q3 = np.percentile(windows, [25, 75])
        into.median_s, into.spread_s = window_estimate(windows), float(q3 - q1)
        into.repeats += row.repeats
        alg, bus = bus_bandwidth(into.op, into.params["bytes"], into.median_s, into.world_size)
        into.extra.update(window_medians=windows.tolist(), passes=into.extra["passes"] + 1, alg_bw=alg, bus_bw=bus)
    return merged

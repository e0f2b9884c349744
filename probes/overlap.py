"""Timing the unfused and overlapped forms of one compute + collective pair, for real.

A `PairPoint` names a pair and its size; every rank of the group builds the same inputs
(seeded), and each form (unfused, then overlapped with k slices for each k) is timed in
interleaved rounds, so a slow spell of the host touches every form alike. A sample is enough
back-to-back calls to last >= 10 ms (the same count on every member), as a training loop runs
the pair step after step; a round's time per form is the slowest member's median over a few
samples (the pair is done when its last rank is); a form's time is the mean of the faster half
of its rounds (`window_estimate`: host noise only ever adds time). Calibration also times the
transfer-only forms (the overlapped form's communication alone), which price its slices. Only
the group's first rank returns rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from probes.collective import group_for, window_estimate
from probes.comm import on_host
from probes.embedding import make_batch, make_tbe
from probes.probe import ProbeSpec, SoloGangProbe
from probes.vocabulary.ops import PAIR_OP, SYMM_MEM_OP, TRANSFER_OP
from probes.vocabulary.pairs import SYMM_MEM_FORM, PairPoint
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement
from probes.workloads.overlap import (
    all_to_all_reference,
    gemm_all_reduce_reference,
    gemm_producer,
    overlapped_all_to_all,
    overlapped_gemm_all_reduce,
    producer_ranges,
    sliced_all_reduce,
    symm_mem_gemm_all_reduce,
    symm_mem_supported,
    tbe_bag_ranges,
    tbe_producer,
)


def pair_forms(
    point: PairPoint,
    rank: int,
    slices: Sequence[int],
    group=None,
    transfer: bool = False,
    device: torch.device | str = "cpu",
) -> dict[str, Callable[[], torch.Tensor]]:
    """Form name ("unfused", "k2", "k4", ...) -> a call running that form once on this rank;
    with `transfer`, also "t1", "t2", ...: the overlapped form's communication alone (its
    slices sent from an output computed beforehand), which prices its transfers. Every tensor
    is made on `device` (the group's, `probes.comm`) from a CPU generator, so the data are the
    same on any device."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(point.seed * 1000 + rank)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device="cpu").to(device)  # noqa: E731
    forms: dict[str, Callable[[], torch.Tensor]] = {}
    if point.pair == "gemm_all_reduce":
        x = randn(point.rows, point.inner)
        w = randn(point.inner, point.cols)
        forms["unfused"] = lambda: gemm_all_reduce_reference(x, w, group)
        for k in slices:
            forms[f"k{k}"] = lambda k=k: overlapped_gemm_all_reduce(x, w, k, group)
        if symm_mem_supported(device, point.rows, point.world):  # PyTorch's fused kernels, a candidate beside ours
            forms[SYMM_MEM_FORM] = lambda: symm_mem_gemm_all_reduce(x, w, group)
        if transfer:
            zeros = torch.zeros(point.rows, point.cols, device=device)  # all-reduced in place, stays finite
            for k in (1, *slices):
                forms[f"t{k}"] = lambda k=k: sliced_all_reduce(zeros, k, group)
        return forms
    layout = point.exchange_layout()
    if point.pair == "gemm_all_to_all":
        x = randn(layout.rows(rank), point.inner)
        w = randn(point.inner, point.cols)
        produce = gemm_producer(x, w)
    else:
        tables = point.rank_tables(rank)
        torch.manual_seed(point.seed * 1000 + rank)
        tbe = make_tbe(tables, device)
        bags = point.rows * point.world
        indices, offsets, _ = make_batch(tables, bags, np.random.default_rng([point.seed, rank]))
        ranges = sorted({r for k in slices for r in producer_ranges(layout, rank, k)})
        inputs = tbe_bag_ranges(
            torch.from_numpy(indices).to(device), torch.from_numpy(offsets).to(device), len(tables), bags, ranges
        )
        produce = tbe_producer(tbe, inputs)
    forms["unfused"] = lambda: all_to_all_reference(produce, layout, group)
    for k in slices:
        forms[f"k{k}"] = lambda k=k: overlapped_all_to_all(produce, layout, k, group, device=device)
    if transfer:
        computed = produce(0, layout.rows(rank))
        for k in (1, *slices):
            forms[f"t{k}"] = lambda k=k: overlapped_all_to_all(
                lambda lo, hi: computed[lo:hi], layout, k, group, device=device
            )
    return forms


def measure_pair(
    point: PairPoint,
    slices: Sequence[int] = (2, 4, 8, 16),
    rounds: int = 15,
    repeats: int = 5,
    group=None,
    min_sample_s: float = 0.01,
    transfer: bool = False,
    device: torch.device | str = "cpu",
) -> list[Measurement]:
    """Time every form of `point` on the group (every member calls this with the same point);
    one row per form on the group's first rank, params = the point plus `k` (1: unfused);
    with `transfer`, also a `TRANSFER_OP` row per slice count (1 included) for the
    communication alone.

    A sample is `inner` back-to-back calls taking at least `min_sample_s` (a sub-millisecond
    pair timed one call at a time is mostly scheduler jitter on a shared host); every member
    runs the same number of calls, agreed from the warm-up (the slowest member's count)."""
    rank = dist.get_rank(group)
    device = torch.device(device)
    done = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    with torch.no_grad():
        forms = pair_forms(point, rank, slices, group, transfer, device)
        names = list(forms)
        calls = []
        for fn in forms.values():  # warm-up: first calls allocate and connect pairs
            fn()
            done()
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            done()
            calls.append(max(1, math.ceil(min_sample_s / max(time.perf_counter() - t0, 1e-7))))
        inner = torch.tensor(calls, dtype=torch.int64, device=device)  # on the group's device (probes.comm)
        dist.all_reduce(inner, op=dist.ReduceOp.MAX, group=group)
        inner_calls = [int(n) for n in inner.tolist()]
        medians = torch.zeros(len(names), rounds, dtype=torch.float64, device=device)
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
            for name in order:
                i = names.index(name)
                fn, n = forms[name], inner_calls[i]
                samples = []
                for _ in range(repeats):
                    dist.barrier(group=group)
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn()
                    done()
                    samples.append((time.perf_counter() - t0) / n)
                medians[i, r] = float(np.median(samples))
    dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
    if rank != 0:
        return []
    medians, inner = on_host(medians), on_host(inner)
    rows = []
    for i, name in enumerate(names):
        windows = medians[i].numpy()
        q1, q3 = np.percentile(windows, [25, 75])
        k = 1 if name in ("unfused", SYMM_MEM_FORM) else int(name[1:])
        params = {**point.to_params(), "k": k}
        op = SYMM_MEM_OP if name == SYMM_MEM_FORM else TRANSFER_OP if name.startswith("t") else PAIR_OP
        rows.append(
            Measurement(
                op,
                params,
                window_estimate(windows),
                float(q3 - q1),
                rounds * repeats * int(inner[i]),
                device=str(device),
                world_size=point.world,
                family="overlap",
                extra={"form": name, "window_medians": windows.tolist(), "calls_per_sample": int(inner[i])},
            )
        )
    return rows


def overlap_points(world: int) -> list[PairPoint]:
    """The measured compute + collective pairs a calibration fits overlap costs to: per pair
    eight sizes from sub-millisecond to tens of milliseconds, square, tall, wide and GEMV-like
    products, skewed splits, few and many tables, on the first two devices (11-28 s each in a
    Ray gang on two CPU cores, the transfer-only forms included)."""
    w = min(world, 2)
    gar = [
        (128, 128, 128),
        (1024, 512, 256),
        (4, 2048, 2048),
        (2048, 512, 768),
        (256, 1024, 1024),
        (4096, 1024, 256),
        (1, 4096, 4096),
        (1024, 4096, 256),
    ]
    ga2a = [
        (256, 256, 256, False),
        (2048, 512, 256, False),
        (1024, 512, 512, True),
        (4096, 768, 128, False),
        (512, 512, 1024, False),
        (8192, 512, 64, False),
        (1024, 1024, 128, False),
        (64, 256, 256, False),
    ]
    emb = [
        (512, 64, 4, 8, False),
        (2048, 128, 8, 16, False),
        (1024, 128, 4, 8, True),
        (4096, 192, 6, 12, False),
        (8192, 128, 4, 8, False),
        (4096, 512, 8, 4, False),
        (16384, 64, 2, 8, False),
        (1024, 256, 8, 32, False),
    ]
    kinds = (
        [PairPoint("gemm_all_reduce", m, n, k, world=w) for m, n, k in gar],
        [PairPoint("gemm_all_to_all", m, n, k, world=w, uneven=u) for m, n, k, u in ga2a],
        [
            PairPoint("embedding_all_to_all", rows, cols, world=w, tables=t, pooling=p, uneven=u)
            for rows, cols, t, p, u in emb
        ],
    )
    # the pairs in turn: a calibration's budget reaches a prefix (a 600 s one on two CPU cores
    # measured eight points, all of them GEMM + all-reduce while they came first)
    return [point for turn in zip(*kinds, strict=True) for point in turn]


def overlap_specs(world: int) -> list[ProbeSpec]:
    """`overlap_points` as gang specs; a pair runs on ranks 0..1 of the gang (world 2)."""
    return [ProbeSpec("overlap", p.to_params(), f"overlap:{i}") for i, p in enumerate(overlap_points(world))]


@dataclass(frozen=True)
class OverlapProbe(SoloGangProbe):
    """A compute + collective pair on a gang: a batch of one point, run once, on ranks
    0..world-1 (the other members wait); a point records the scope of those ranks."""

    family: str = "overlap"

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        world = int(spec.params.get("world", 2))
        return ProbeSpec(spec.family, {**spec.params, "scope": placement.scope(range(world))}, spec.key)

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        rows = []
        for spec in specs:
            point = PairPoint(**spec.params)
            group = group_for(list(range(point.world)))  # every member of the gang takes part in this
            if dist.get_rank() < point.world:
                rows += measure_pair(point, group=group, transfer=True, device=device)
        return rows


PROBE = OverlapProbe()

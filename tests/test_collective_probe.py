"""Collective probes on subgroups and with uneven splits, in three real gloo processes."""

import types

import numpy as np
import pytest
from spawned import on_gloo_ranks

import probes.collective
from probes.collective import (
    CollectivePoint,
    measure_collective,
    measure_collectives,
    merge_passes,
    message_numel,
    window_estimate,
)
from probes.collective_sweep import collective_groups, collective_specs
from probes.probe import ProbeSpec
from probes.sweep import collective_batches
from probes.vocabulary.ops import bus_bandwidth, uneven_splits
from probes.vocabulary.records import Measurement


def _subgroup_rows(rank: int) -> list:
    rows = measure_collective("all_reduce", 4096, ranks=[0, 2], target_s=0.01)
    rows += measure_collective("all_to_all", 4096, uneven=True, seed=5, target_s=0.01)
    rows += measure_collective("reduce_scatter", 4096, ranks=[1, 2], target_s=0.01)
    return [[r.op, r.params["world"], r.params["bytes"], r.params.get("uneven", False)] for r in rows]


@pytest.mark.timeout(120)
def test_subgroups_and_uneven_all_to_all():
    got = on_gloo_ranks(_subgroup_rows, 3)
    splits = uneven_splits(4096 // 4 // 3 * 3, 3, 5)
    biggest = int(max(splits.sum(axis=1).max(), splits.sum(axis=0).max())) * 4
    # The first member of each group reports: rank 0 for [0, 2] and the world, rank 1 for [1, 2].
    assert got[0] == [["all_reduce", 2, 4096, False], ["all_to_all", 3, biggest, True]]
    assert got[1] == [["reduce_scatter", 2, 4096, False]]
    assert got[2] == []
    assert biggest > (4096 // 4 // 3 * 3) * 4  # skewed: some rank moves more than an even send buffer


def _cut_and_whole(rank: int) -> dict:
    """Rank 0's clock ticks once per look (one before each point's sizing, then one before
    each window); rank 1's never passes `stop_at`."""
    points = [CollectivePoint(op, 1024 * (i + 1)) for i, op in enumerate(["all_reduce", "broadcast", "all_gather"])]
    out = {}
    for name, stop_at in (("in_windows", 5.5), ("in_sizing", 2.5), ("whole", 1e9)):
        calls = iter(range(1, 1000))
        probes.collective.time = types.SimpleNamespace(time=lambda: next(calls) if rank == 0 else 0.0)
        rows = measure_collectives(points, "cpu", target_s=0.01, windows=2, stop_at=stop_at)
        out[name] = [[r.op, len(r.extra["window_medians"])] for r in rows]
    return out


@pytest.mark.timeout(120)
def test_a_batch_cut_at_stop_at_stops_every_member_together_and_keeps_what_it_measured():
    got = on_gloo_ranks(_cut_and_whole, 2)
    # Three points sized (looks 1-3), then windows round-robin, window 1 of every point first:
    # the third window (look 6) is cut on both ranks (rank 1 alone would have gone on and
    # hung), so the first two points have one window each.
    assert got[0]["in_windows"] == [["all_reduce", 1], ["broadcast", 1]]
    # Cut while sizing (look 3): nothing was timed, nothing is reported, nobody hangs.
    assert got[0]["in_sizing"] == []
    assert [op for op, _ in got[0]["whole"]] == ["all_reduce", "broadcast", "all_gather"]
    assert got[1] == {"in_windows": [], "in_sizing": [], "whole": []}


def test_bus_bandwidth_conventions():
    assert bus_bandwidth("all_reduce", 8.0, 1.0, 4) == (8.0, 12.0)
    assert bus_bandwidth("all_gather", 8.0, 1.0, 4) == (8.0, 6.0)
    assert bus_bandwidth("broadcast", 8.0, 1.0, 4) == (8.0, 8.0)


def test_collective_groups_cover_every_size_intra_and_inter():
    nodes = ["a", "a", "b", "b"]
    groups = collective_groups(nodes)
    assert (0, 1) in groups and (0, 2) in groups  # size 2 within node a, and across a and b
    assert {len(g) for g in groups} == {2, 3, 4}
    assert collective_groups(["a", "a"]) == [(0, 1)]
    specs = collective_specs([(0, 1), (0, 2)], 64)
    assert {tuple(s.params["ranks"]) for s in specs} == {(0, 1), (0, 2)}
    for ranks in [(0, 1), (0, 2)]:
        # 4..64 bytes, two per octave; sizes the pair rounds to the same float32 message
        # (4, 5, 8, 11 -> 2 elements; 16, 22 -> 4) are measured once
        mine = [s for s in specs if tuple(s.params["ranks"]) == ranks and s.params["op"] == "all_reduce"]
        assert sorted(message_numel(s.params["bytes"], 2) for s in mine) == [2, 4, 8, 10, 16]


def _visit(op: str, nbytes: int, windows: list[float], family: str = "collective") -> Measurement:
    extra = {"window_medians": windows, "ranks": [0, 1], "alg_bw": 0.0, "bus_bw": 0.0}
    return Measurement(
        op,
        {"op": op, "bytes": nbytes, "world": 2, "scope": "intra"},
        float(np.median(windows)),
        0.0,
        3 * len(windows),
        world_size=2,
        family=family,
        extra=extra,
    )


def test_merge_passes_pools_every_visit_of_a_point():
    gemm = Measurement("gemm", {"M": 1, "N": 1, "K": 1}, 1.0, 0.0, 5, family="gemm")
    rows = [
        _visit("all_reduce", 64, [1.0, 1.1]),
        gemm,
        _visit("all_reduce", 128, [2.0, 2.0]),
        _visit("all_reduce", 64, [1.4, 1.5]),
        _visit("all_reduce", 64, [0.9, 5.0]),
    ]
    merged = merge_passes(rows)
    assert [(r.op, r.params.get("bytes")) for r in merged] == [("all_reduce", 64), ("gemm", None), ("all_reduce", 128)]
    point = merged[0]
    # all six windows pooled, their faster half averaged: (0.9 + 1.0 + 1.1) / 3, not a figure
    # of the three visits' own times; the 5.0 window of the third visit is dropped
    assert point.median_s == pytest.approx(1.0)
    assert point.extra["passes"] == 3 and point.repeats == 18 and len(point.extra["window_medians"]) == 6
    assert point.extra["alg_bw"] == pytest.approx(64 / point.median_s)
    assert merged[2].extra["passes"] == 1 and merged[2].median_s == 2.0
    assert rows[0].median_s == pytest.approx(1.05)  # the input rows are left as they were


def test_window_estimate_averages_the_faster_half_and_ignores_slow_windows():
    assert window_estimate([3.0]) == 3.0
    assert window_estimate([2.0, 1.0]) == 1.0
    assert window_estimate([1.0, 1.2, 9.0, 9.0, 1.1]) == pytest.approx(1.05)
    # one-sided noise: slowing windows down further never moves the estimate
    assert window_estimate([1.0, 1.2, 90.0, 90.0, 1.1]) == window_estimate([1.0, 1.2, 9.0, 9.0, 1.1])
    # but the fast half is averaged, not its minimum taken
    assert window_estimate([0.5, 1.0, 2.0, 2.0]) == pytest.approx(0.75)


def test_collective_batches_group_points_of_one_rank_group_within_a_memory_cap():
    def spec(nbytes: int, ranks: list[int], family: str = "collective") -> ProbeSpec:
        return ProbeSpec(family, {"op": "all_reduce", "bytes": nbytes, "ranks": ranks})

    specs = [
        spec(10, [0, 1]),
        spec(10, [0, 1]),
        spec(10, [0, 1]),
        spec(10, [0, 2]),
        spec(40, [0, 2]),
        spec(0, [0, 1, 2], "training"),
        spec(10, [0, 2]),
    ]
    batches = collective_batches(specs, max_points=2, max_bytes=100)
    # two per batch at most; a new rank group starts a batch; 2 x (10 + 40) bytes alive fits 100, a
    # training point is alone and the points after it start afresh
    assert [[s.params["bytes"] for s in b] for b in batches] == [[10, 10], [10], [10, 40], [0], [10]]
    capped = collective_batches([spec(30, [0, 1])] * 5, max_points=12, max_bytes=130)
    assert [len(b) for b in capped] == [2, 2, 1]  # 2 x 30 alive per point: two fit in 130, a third does not

"""Collective probes on subgroups and with uneven splits, in three real gloo processes."""
import json
import tempfile

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from probes.collective import bus_bandwidth, forget_groups, measure_collective, message_numel, uneven_splits
from probes.sweep import collective_groups, collective_specs


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    try:
        rows = measure_collective("all_reduce", 4096, ranks=[0, 2], target_s=0.01)
        rows += measure_collective("all_to_all", 4096, uneven=True, seed=5, target_s=0.01)
        rows += measure_collective("reduce_scatter", 4096, ranks=[1, 2], target_s=0.01)
        with open(f"{out_dir}/{rank}.json", "w") as f:
            json.dump([[r.op, r.params["world"], r.params["bytes"], r.params.get("uneven", False)] for r in rows], f)
    finally:
        forget_groups()
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_subgroups_and_uneven_all_to_all():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(f"{tmp}/init", tmp), nprocs=3)
        got = {rank: json.load(open(f"{tmp}/{rank}.json")) for rank in range(3)}
    splits = uneven_splits(4096 // 4 // 3 * 3, 3, 5)
    biggest = int(max(splits.sum(axis=1).max(), splits.sum(axis=0).max())) * 4
    # The first member of each group reports: rank 0 for [0, 2] and the world, rank 1 for [1, 2].
    assert got[0] == [["all_reduce", 2, 4096, False], ["all_to_all", 3, biggest, True]]
    assert got[1] == [["reduce_scatter", 2, 4096, False]]
    assert got[2] == []
    assert biggest > (4096 // 4 // 3 * 3) * 4  # skewed: some rank moves more than an even send buffer


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

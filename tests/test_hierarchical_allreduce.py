"""The hierarchical chunked all-reduce, executed for real on 4 gloo ranks laid out 2x2."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawned import exit_worker

from policies.chunking import choose_chunking
from predictors.network import Dimension, NetworkTopology
from probes.vocabulary.chunks import ChunkSchedule, ScheduleError, dimension_lines, rank_coords
from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.hierarchical_allreduce import HierarchicalAllReduce, hierarchical_allreduce_hook
from probes.workloads.transformer import ParallelTransformer

GRID = (2, 2)


def themis_schedule() -> ChunkSchedule:
    """What the policy picks for a 2x2 grid whose second dimension is twice as fast: per-chunk
    orders that differ (chunks alternate which dimension they reduce-scatter first)."""
    topology = NetworkTopology("grid", (Dimension(2, 10.0, 0.0, "ring"), Dimension(2, 20.0, 0.0, "ring")))
    decision = choose_chunking(topology, 4 * 2**20, chunk_counts=(4,), schedules=("themis_fifo",))
    return ChunkSchedule.from_dict(decision.choice_detail["chunk_schedule"])


def test_grid_layout():
    assert [rank_coords(r, (2, 3)) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert dimension_lines((2, 3), 0) == [(0, 1), (2, 3), (4, 5)]
    assert dimension_lines((2, 3), 1) == [(0, 2, 4), (1, 3, 5)]
    schedule = themis_schedule()
    assert len({s for s in schedule.orders}) == 2  # not every chunk takes the same order


def _sum_worker(rank: int, init: str, out: str, schedules: list[dict]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=4)
    try:
        torch.set_num_threads(1)
        errors = []
        for data in schedules:
            reducer = HierarchicalAllReduce(GRID, ChunkSchedule.from_dict(data))
            for n in (1, 37, 4099):  # lengths that do not split evenly into chunks x ranks
                x = torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + n))
                expected = x.clone()
                dist.all_reduce(expected)
                reducer.all_reduce_(x)
                errors.append(float((x - expected).abs().max()))
        json.dump(errors, open(f"{out}/{rank}.json", "w"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_worker()


def test_hierarchical_all_reduce_equals_all_reduce_under_any_schedule():
    schedules = [
        ChunkSchedule.baseline(GRID, 1).to_dict(),
        ChunkSchedule.baseline(GRID, 3).to_dict(),
        themis_schedule().to_dict(),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_sum_worker, args=(f"{tmp}/init", tmp, schedules), nprocs=4)
        errors = [e for r in range(4) for e in json.load(open(f"{tmp}/{r}.json"))]
    assert len(errors) == 4 * 3 * 3
    assert max(errors) < 1e-5  # equal up to float summation order


def _train_worker(rank: int, init: str, out: str, schedule: dict | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=4)
    try:
        torch.set_num_threads(1)
        spec = TransformerSpec(layers=2, hidden=32, heads=4, seq_len=8, batch_size=2, world_size=4, dropout=0.0)
        hook = None
        if schedule is not None:
            hook = (HierarchicalAllReduce(GRID, ChunkSchedule.from_dict(schedule)), hierarchical_allreduce_hook)
        model = ParallelTransformer(spec, rank, torch.device("cpu"), comm_hook=hook)
        losses = [model.step() for _ in range(8)]
        json.dump(losses, open(f"{out}/{rank}.json", "w"))
        del model
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_worker()


def _losses(schedule: dict | None) -> list[list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_train_worker, args=(f"{tmp}/init", tmp, schedule), nprocs=4)
        return [json.load(open(f"{tmp}/{r}.json")) for r in range(4)]


def test_ddp_hook_trains_with_the_same_loss_curve_as_plain_ddp():
    plain = _losses(None)
    hierarchical = _losses(themis_schedule().to_dict())
    for rank in range(4):
        assert hierarchical[rank] == pytest.approx(plain[rank], rel=1e-5)
        assert plain[rank][-1] < plain[rank][0]  # it trains
    assert len({round(p[0], 6) for p in plain}) > 1  # ranks see different data, so averaging matters


def test_mismatched_grid_is_refused():
    with pytest.raises(ScheduleError, match=r"schedule is for grid \(2, 2\), not \(1,\)"):
        # Checked before any group is created, so no process group is needed beyond a 1-rank one.
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
            try:
                HierarchicalAllReduce((1,), ChunkSchedule.baseline((2, 2), 1))
            finally:
                dist.destroy_process_group()

"""The real sharded DLRM on two gloo ranks (torch.multiprocessing, no Ray needed)."""

import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawned import exit_worker

from probes.vocabulary.jobspec import JobSpec
from probes.workloads.dlrm import ShardedDLRM
from probes.workloads.plan_race import drift_adjusted, race_plans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, job, placement, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = ShardedDLRM(JobSpec.from_dict(job), placement, rank, world, torch.device("cpu"))
        result = model.run(iterations=8, warmup=2)
        weights = [p.detach().clone() for p in model.dense.parameters()]
        queue.put((rank, result.median_s, result.losses, [w.sum().item() for w in weights]))
    finally:
        dist.destroy_process_group()
    exit_worker(queue)


def _chunked_worker(rank, world, port, job, placement_and_schedule, queue):
    """As `_worker`, with the dense gradients averaged by a chunked hierarchical all-reduce."""
    torch.set_num_threads(1)
    placement, schedule = placement_and_schedule
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = ShardedDLRM(
            JobSpec.from_dict(job), placement, rank, world, torch.device("cpu"), chunk_schedule=schedule
        )
        result = model.run(iterations=8, warmup=2)
        queue.put((rank, result.median_s, result.losses, [p.detach().sum().item() for p in model.dense.parameters()]))
    finally:
        dist.destroy_process_group()
    exit_worker(queue)


def _pooled_worker(rank, world, port, job, placement, queue):
    """A rank's embeddings (after the all-to-all, reduce-scatter and replica lookups) against
    plain lookups of every rank's weights, gathered."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = ShardedDLRM(JobSpec.from_dict(job), placement, rank, world, torch.device("cpu"))
        got = model._embeddings(model.batches[0]).detach()
        pieces = {}  # kind -> [(table, first row, weights)] in the rank's order
        for kind, tbe, shards in (
            ("exchanged", model.tbe, model.exchanged),
            ("row_wise", model.rw_tbe, model.row_wise),
            ("replicated", model.dp_tbe, model.replicated),
        ):
            weights = tbe.split_embedding_weights() if tbe is not None else []
            pieces[kind] = [
                (s.table, model.first_row.get((s.table, rank), 0), w.detach().clone()) for s, w in zip(shards, weights)
            ]
        everyone = [None] * world
        dist.all_gather_object(everyone, pieces)
        B = model.spec.batch_size
        ids = lambda t: torch.from_numpy(model._global_ids(0, t)[rank * B : (rank + 1) * B])  # noqa: E731
        expected = [w[ids(t)].sum(dim=1) for q in range(world) for t, _, w in everyone[q]["exchanged"]]
        for t, _, _ in pieces["row_wise"]:
            stacked = sorted((first, w) for q in range(world) for tt, first, w in everyone[q]["row_wise"] if tt == t)
            expected.append(torch.cat([w for _, w in stacked])[ids(t)].sum(dim=1))
        expected += [w[ids(t)].sum(dim=1) for t, _, w in pieces["replicated"]]
        replicas_equal = all(
            torch.equal(w, w0) for (_, _, w), (_, _, w0) in zip(pieces["replicated"], everyone[0]["replicated"])
        )
        queue.put((rank, float((got - torch.cat(expected, dim=1)).abs().max()), tuple(got.shape), replicas_equal))
    finally:
        dist.destroy_process_group()
    exit_worker(queue)


def _race_worker(rank, world, port, job, plans, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        race = race_plans(
            JobSpec.from_dict(job), plans, rank, world, torch.device("cpu"), rounds=3, steps_per_round=2, warmup=1
        )
        queue.put((rank, race.round_medians_s, [len(s.iteration_s) for s in race.steps], race.plan_seconds()))
    finally:
        dist.destroy_process_group()
    exit_worker(queue)


def run_two_ranks(job, placement, worker=_worker):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, 2, port, job, placement, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((r, (t, losses, w)) for r, t, losses, w in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


@pytest.mark.parametrize("placement", [[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
def test_sharded_dlrm_trains_on_two_ranks(tiny_job_dict, placement):
    out = run_two_ranks(tiny_job_dict, placement)
    (t0, losses0, w0), (t1, _, w1) = out[0], out[1]
    assert t0 > 0 and t0 == t1, "both ranks report the slowest rank's step time"
    assert len(losses0) == 8
    assert all(0.0 < loss < 5.0 for loss in losses0)
    # DDP keeps the dense replicas identical after every step.
    assert w0 == pytest.approx(w1, rel=1e-5)


def test_the_plans_chunk_schedule_averages_dense_gradients_like_ddp(tiny_job_dict):
    from probes.vocabulary.chunks import ChunkSchedule

    placement = [0, 1, 0, 1, 0]
    plain = run_two_ranks(tiny_job_dict, placement)
    chunked = run_two_ranks(tiny_job_dict, (placement, ChunkSchedule.baseline((2,), 3).to_dict()), _chunked_worker)
    for rank in (0, 1):
        assert chunked[rank][1] == pytest.approx(plain[rank][1], rel=1e-5)  # same loss curve
        assert chunked[rank][2] == pytest.approx(plain[rank][2], rel=1e-5)  # same dense weights


def test_bad_placement_is_refused(tiny_job_dict):
    job = JobSpec.from_dict(tiny_job_dict)
    with pytest.raises(ValueError, match="plan places 2 tables, job has 5"):
        ShardedDLRM(job, [0, 1], 0, 2, torch.device("cpu"))


MIXED = [0, {"type": "row_wise"}, {"type": "column_wise", "ranks": [1, 0]}, {"type": "data_parallel"}, 1]


def test_every_sharding_type_looks_up_what_the_whole_tables_would(tiny_job_dict):
    out = run_two_ranks(tiny_job_dict, MIXED, worker=_pooled_worker)
    width = sum(t["embedding_dim"] for t in tiny_job_dict["tables"])
    for rank in (0, 1):
        error, shape, replicas_equal = out[rank]
        assert shape == (tiny_job_dict["batch_size"], width)
        assert error < 1e-4, f"rank {rank}: embeddings differ from plain lookups by {error}"
        assert replicas_equal


def test_a_mixed_plan_trains_and_keeps_replicas_in_step(tiny_job_dict):
    out = run_two_ranks(tiny_job_dict, MIXED)
    (t0, losses0, w0), (t1, _, w1) = out[0], out[1]
    assert t0 > 0 and t0 == t1
    assert all(0.0 < loss < 5.0 for loss in losses0)
    assert w0 == pytest.approx(w1, rel=1e-5)


def test_racing_plans_times_each_in_every_round(tiny_job_dict):
    out = run_two_ranks(tiny_job_dict, [[0, 1, 0, 1, 0], MIXED], worker=_race_worker)
    medians, steps, seconds = out[0]
    assert medians.shape == (3, 2) and (medians > 0).all()
    assert steps == [6, 6]
    assert (seconds > 0).all()
    assert np.array_equal(out[0][0], out[1][0]), "every rank records the slowest rank's steps"


def test_drift_between_rounds_cancels_in_the_race():
    """Plan B is 10% slower than A in every round, while the host's speed drifts 3x between
    rounds and one round hits B alone with a burst: the adjusted times keep B/A = 1.1."""
    drift = np.array([1.0, 3.0, 1.5, 0.8, 2.0])
    rounds = np.stack([drift * 10.0, drift * 11.0], axis=1)
    rounds[2, 1] *= 4  # one disturbed measurement
    a, b = drift_adjusted(rounds)
    assert b / a == pytest.approx(1.1)
    # the raw medians over rounds would not see it: they follow whichever rounds were slow
    assert np.median(rounds[:, 1]) / np.median(rounds[:, 0]) != pytest.approx(1.1)


def _overlap_worker(rank, world, port, job, placement_and_slices, queue):
    """The same steps unfused and with the lookup + all-to-all overlapped in k slices."""
    torch.set_num_threads(1)
    placement, slices = placement_and_slices
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out = []
        for k in (1, slices):
            model = ShardedDLRM(JobSpec.from_dict(job), placement, rank, world, torch.device("cpu"), overlap_slices=k)
            losses = [model.step(model.batches[i % len(model.batches)]) for i in range(4)]
            tables = [w.detach().clone() for w in model.tbe.split_embedding_weights()] if model.tbe is not None else []
            out.append((losses, [p.detach().clone() for p in model.dense.parameters()], tables))
        (l1, d1, t1), (lk, dk, tk) = out
        queue.put(
            (
                rank,
                (l1, lk),
                max(float((a - b).abs().max()) for a, b in zip(d1, dk)),
                max([float((a - b).abs().max()) for a, b in zip(t1, tk)] + [0.0]),
            )
        )
    finally:
        dist.destroy_process_group()
    exit_worker(queue)


@pytest.mark.parametrize("placement,slices", [([0, 1, 0, 1, 0], 4), ([0, 0, 0, 0, 0], 3)])
def test_overlapped_lookup_and_all_to_all_train_like_the_unfused_pair(tiny_job_dict, placement, slices):
    """Substituting the embedding + all-to-all pair (the plan's decision) changes no number: the
    losses, the dense weights and the tables after fused-SGD backward match the unfused run,
    also when one rank holds no table (it only receives, and carries the backward exchange)."""
    out = run_two_ranks(tiny_job_dict, (placement, slices), _overlap_worker)
    for rank in (0, 1):
        (unfused, overlapped), dense_diff, table_diff = out[rank]
        assert unfused[0] != unfused[-1]  # it trains
        assert overlapped == pytest.approx(unfused, rel=1e-5)
        assert dense_diff < 1e-5 and table_diff < 1e-5

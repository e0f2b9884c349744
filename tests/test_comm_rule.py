"""The communication rule (`probes.comm`): every tensor handed to torch.distributed is on the
group's device. On this CPU machine a forgotten `device=` cannot show (the default device is
the CPU), so every path runs under `audit`, which marks tensors made without an explicit device
and refuses them, and any tensor on another device, at the torch.distributed call: the control
tensors that were left on the CPU (the agreed repeat count and window medians of the collective
probe, the slowest-rank step times, the pair probe's call counts and medians) fail here exactly
as they fail under NCCL on a GPU."""

import json
import tempfile
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawned import exit_worker

from probes.comm import CommDeviceError, audit


def _run_ranks(worker, world: int, *args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, *args, f"{tmp}/init", tmp), nprocs=world)
        return [json.load(open(f"{tmp}/{r}.json")) for r in range(world)]


def _every_path(rank: int, world: int, job: dict, init_file: str, out_dir: str) -> None:
    """Each communication path of the project, audited against the CPU (the gloo group's device)."""
    from probes.collective import CollectivePoint, forget_groups, measure_collectives
    from probes.overlap import measure_pair
    from probes.vocabulary.chunks import ChunkSchedule
    from probes.vocabulary.jobspec import JobSpec
    from probes.vocabulary.pairs import PairPoint
    from probes.vocabulary.transformer_spec import TransformerSpec
    from probes.workloads.dlrm import ShardedDLRM
    from probes.workloads.transformer import ParallelTransformer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cpu = torch.device("cpu")
    report: dict = {}
    try:
        calls: Counter = Counter()
        with audit(cpu, calls):
            points = [
                CollectivePoint(op, 4096)
                for op in ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")
            ]
            points.append(CollectivePoint("all_to_all", 4096, uneven=True, seed=3))
            rows = measure_collectives(points, cpu, target_s=0.01, windows=2)
            rows += measure_collectives([CollectivePoint("all_reduce", 1024, ranks=(0, 1))], cpu, target_s=0.01)
            report["collective_rows"] = len(rows)
            forget_groups()
            for pair in ("gemm_all_reduce", "gemm_all_to_all", "embedding_all_to_all"):
                point = PairPoint(
                    pair,
                    16,
                    32,
                    8 if pair != "embedding_all_to_all" else 0,
                    world=world,
                    tables=2,
                    pooling=2,
                    num_embeddings=200,
                )
                report[pair] = len(
                    measure_pair(point, slices=(2,), rounds=2, repeats=1, min_sample_s=0.0, transfer=True, device=cpu)
                )
            spec = JobSpec.from_dict(job)
            mixed = [0, {"type": "row_wise"}, {"type": "column_wise", "ranks": [0, 1]}, {"type": "data_parallel"}, 1]
            schedule = ChunkSchedule.baseline((world,), 2).to_dict()  # the hierarchical all-reduce hook
            dlrm = ShardedDLRM(spec, mixed, rank, world, cpu, chunk_schedule=schedule)
            report["dlrm_steps"] = len(dlrm.run(iterations=2, warmup=1).iteration_s)
            overlapped = ShardedDLRM(spec, [0, 1, 0, 1, 0], rank, world, cpu, overlap_slices=2)
            report["overlapped_steps"] = len(overlapped.run(iterations=2, warmup=1).iteration_s)
            tp = TransformerSpec(
                layers=1, hidden=32, heads=4, seq_len=8, batch_size=2, world_size=world, tensor_parallel=world
            )
            transformer = ParallelTransformer(tp, rank, cpu, overlap_slices={"b0.out": 2, "b0.fc2": 2})
            report["transformer_steps"] = len(transformer.run(2, 1).iteration_s)
        report["calls"] = dict(calls)
        # the check itself: a control tensor made without device= is refused, as NCCL would refuse it
        with audit(cpu):
            try:
                dist.all_reduce(torch.tensor([1.0]))
            except CommDeviceError as exc:
                report["implicit"] = str(exc)
            try:
                dist.all_reduce(torch.zeros(1, device="meta"))
            except CommDeviceError as exc:
                report["wrong_device"] = str(exc)
        with open(f"{out_dir}/{rank}.json", "w") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()
    exit_worker()


@pytest.mark.timeout(300)
def test_every_communication_path_hands_torch_distributed_only_tensors_on_the_groups_device(tiny_job_dict):
    results = _run_ranks(_every_path, 2, tiny_job_dict)
    first = results[0]
    assert first["collective_rows"] == 7
    assert first["gemm_all_reduce"] > 0 and first["gemm_all_to_all"] > 0 and first["embedding_all_to_all"] > 0
    assert first["dlrm_steps"] == 2 and first["overlapped_steps"] == 2 and first["transformer_steps"] == 2
    for report in results:
        # overlapped all-to-alls go through batched point-to-point, never a lone isend / irecv
        assert report["calls"].get("batch_isend_irecv", 0) > 0
        assert "isend" not in report["calls"] and "irecv" not in report["calls"]
        assert "created without device=" in report["implicit"] and "all_reduce" in report["implicit"]
        assert "on meta; the group's device is cpu" in report["wrong_device"]


@pytest.mark.parametrize(
    ("shim", "new", "old"),
    [
        ("all_gather_single", "all_gather_single", "all_gather_into_tensor"),
        ("reduce_scatter_single", "reduce_scatter_single", "reduce_scatter_tensor"),
    ],
)
def test_flat_collectives_take_the_older_torch_name_where_the_new_one_is_missing(monkeypatch, shim, new, old):
    # torch 2.11 (the lent GPU machine's) has only the older names; 2.13 deprecates them.
    import probes.comm as comm

    calls = []

    def record(name):
        return lambda out, inp, group=None, async_op=False: calls.append((name, out, inp, group, async_op))

    out, inp, group = torch.empty(4), torch.ones(2), object()
    monkeypatch.setattr(dist, new, record(new), raising=False)
    monkeypatch.setattr(dist, old, record(old))
    getattr(comm, shim)(out, inp, group=group, async_op=True)
    monkeypatch.delattr(dist, new)
    getattr(comm, shim)(out, inp, group=group)
    assert [(c[0], c[3], c[4]) for c in calls] == [(new, group, True), (old, group, False)]
    assert all(c[1] is out and c[2] is inp for c in calls)

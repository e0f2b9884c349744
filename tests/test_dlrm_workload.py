"""The real sharded DLRM on two gloo ranks (torch.multiprocessing, no Ray needed)."""
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from probes.jobspec import JobSpec
from probes.workloads.dlrm import ShardedDLRM


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


def run_two_ranks(job, placement):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, job, placement, queue)) for r in range(2)]
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
    (t0, losses0, w0), (t1, losses1, w1) = out[0], out[1]
    assert t0 > 0 and t0 == t1, "both ranks report the slowest rank's step time"
    assert len(losses0) == 8
    assert all(0.0 < l < 5.0 for l in losses0)
    # DDP keeps the dense replicas identical after every step.
    assert w0 == pytest.approx(w1, rel=1e-5)


def test_bad_placement_is_refused(tiny_job_dict):
    job = JobSpec.from_dict(tiny_job_dict)
    with pytest.raises(ValueError, match="plan places 2 tables, job has 5"):
        ShardedDLRM(job, [0, 1], 0, 2, torch.device("cpu"))

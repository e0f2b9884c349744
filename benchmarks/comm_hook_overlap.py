"""How much of the chunked all-reduce DDP hook's communication hides behind backward, side by side.

    .venv/bin/python benchmarks/comm_hook_overlap.py [--rounds 7] [--steps 10]

On 2 gloo ranks (one thread each), a DDP MLP whose gradients fill several buckets trains with:
- `no_sync`: backward without any all-reduce (compute alone);
- `blocking`: the hook reducing each bucket on the backward thread (what the hook did before
  issue #27: backward stalls at every bucket);
- `async`: the hook as shipped (`probes/workloads/hierarchical_allreduce.py`), which reduces
  on its own thread and returns a future;
- `ddp`: DDP's own all-reduce (its reference).
Plus the communication alone: every bucket's all-reduce back to back, on idle ranks. Rounds
rotate the order of the variants; per variant the median step over rounds of medians.
Overlap of a variant = (compute + communication - step) / communication: 0 when nothing hides,
1 when all of it does (negative when the variant adds work of its own); and the share of the
communication the asynchronous hook hides against the blocking one, (blocking - async) /
communication. Writes benchmarks/results/comm_hook_overlap.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from probes.vocabulary.chunks import ChunkSchedule  # noqa: E402
from probes.workloads.hierarchical_allreduce import HierarchicalAllReduce, hierarchical_allreduce_hook  # noqa: E402

WIDTH, LAYERS, BATCH, BUCKET_MB = 1024, 6, 64, 1
VARIANTS = ("no_sync", "blocking", "async", "ddp")


def blocking_hook(state: HierarchicalAllReduce, bucket):
    """The chunked reduction on the backward thread: the hook returns a completed future."""
    buffer = bucket.buffer()
    state.all_reduce_(buffer).div_(state.schedule.world_size)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


blocking_hook.__annotations__ = dict(hierarchical_allreduce_hook.__annotations__)


def _model(variant: str, reducer: HierarchicalAllReduce) -> DistributedDataParallel:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(LAYERS)]
    ddp = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=BUCKET_MB)
    if variant == "blocking":
        ddp.register_comm_hook(reducer, blocking_hook)
    elif variant == "async":
        ddp.register_comm_hook(reducer, hierarchical_allreduce_hook)
    return ddp


def _step_s(ddp: DistributedDataParallel, variant: str, x: torch.Tensor, steps: int) -> float:
    times = []
    for _ in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        if variant == "no_sync":
            with ddp.no_sync():
                ddp(x).square().mean().backward()
        else:
            ddp(x).square().mean().backward()
        times.append(time.perf_counter() - t0)
        ddp.zero_grad(set_to_none=True)
    return statistics.median(times[2:])


def _communication_s(reducer: HierarchicalAllReduce, ddp: DistributedDataParallel, steps: int) -> float:
    """Every bucket's worth of gradients reduced back to back, nothing else running."""
    sizes, current, cap = [], 0, BUCKET_MB * 2**20 // 4
    for p in reversed(list(ddp.parameters())):
        current += p.numel()
        if current >= cap:
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    buffers = [torch.randn(n) for n in sizes]
    times = []
    for _ in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        for b in buffers:
            reducer.all_reduce_(b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def _rank(rank: int, init: str, out: str, rounds: int, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    reducer = HierarchicalAllReduce((2,), ChunkSchedule.baseline((2,), 2))
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))
    models = {v: _model(v, reducer) for v in VARIANTS}
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS + ("communication",)}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            per_round[variant].append(_step_s(models[variant], variant, x, steps))
        per_round["communication"].append(_communication_s(reducer, models["ddp"], steps))
    if rank == 0:
        json.dump(per_round, open(f"{out}/rounds.json", "w"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/comm_hook_overlap.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/init", tmp, args.rounds, args.steps), nprocs=2)
        rounds = json.load(open(f"{tmp}/rounds.json"))
    median = {k: statistics.median(v) for k, v in rounds.items()}
    compute, communication = median["no_sync"], median["communication"]
    result = {
        "command": "benchmarks/comm_hook_overlap.py " + " ".join(sys.argv[1:]),
        "model": {"width": WIDTH, "layers": LAYERS, "batch": BATCH, "bucket_cap_mb": BUCKET_MB, "world": 2},
        "median_ms": {k: v * 1e3 for k, v in median.items()},
        "spread_ms": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in rounds.items()},
        "overlap": {v: (compute + communication - median[v]) / communication for v in ("blocking", "async", "ddp")},
        "async_vs_blocking": median["async"] / median["blocking"],
        "hidden_vs_blocking": (median["blocking"] - median["async"]) / communication,
    }
    for k in VARIANTS + ("communication",):
        lo, hi = result["spread_ms"][k]
        print(f"{k:14s} {result['median_ms'][k]:8.2f} ms  (rounds {lo:.2f}-{hi:.2f})")
    for v, o in result["overlap"].items():
        print(f"overlap {v:9s} {o:+.2f}")
    print(f"async / blocking step: {result['async_vs_blocking']:.3f}")
    print(f"communication hidden by the async hook against the blocking one: {result['hidden_vs_blocking']:.0%}")
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

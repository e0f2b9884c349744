"""Whether binding each rank to its own cores (`orchestrator.core_binding`) narrows a data-parallel
step's launch-to-launch spread, side by side with unbound launches.

    .venv/bin/python benchmarks/core_binding.py [--launches 6 --iterations 20]

Launches two-rank gloo jobs of the transformer block stack (`probes.workloads.transformer`, the
launcher's and the calibration's workload) as fresh torch-spawned process pairs, alternating
bound and unbound launches (the order flipped every round), for a tiny step (1 layer, hidden
64, batch 2, sequence 64: the e2e benchmark's smallest tasks) and a mid-sized one (2 layers,
hidden 128, batch 8). Prints each launch's median step and, per case, the launch medians' median,
sd / mean and max / min, and the p10-p90 of every step pooled. Writes
benchmarks/results/core_binding.json. Run it with nothing else on the host.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.e2e_accuracy import write_result  # noqa: E402

CASES = {
    "tiny": {"layers": 1, "hidden": 64, "heads": 4, "seq_len": 64, "batch_size": 2},
    "mid": {"layers": 2, "hidden": 128, "heads": 4, "seq_len": 64, "batch_size": 8},
}
WORLD = 2


def _rank(rank: int, port: int, case: dict, bound: bool, iterations: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from orchestrator.core_binding import Slot, bind_slot
    from probes.vocabulary.transformer_spec import TransformerSpec
    from probes.workloads.transformer import ParallelTransformer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # as the launcher's workers run
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    if bound:  # after the group is up, as the launcher binds: gloo's threads are bound too
        bind_slot(Slot(rank, WORLD), "exclusive")
    spec = {**case, "world_size": WORLD, "tensor_parallel": 1, "dropout": 0.1, "seed": 0, "name": "binding"}
    result = ParallelTransformer(TransformerSpec.from_dict(spec), rank, torch.device("cpu")).run(iterations, 5)
    if rank == 0:
        queue.put(result.iteration_s)
    dist.barrier()
    dist.destroy_process_group()


def launch(case: dict, bound: bool, port: int, iterations: int) -> list[float]:
    """One fresh two-rank job; rank 0's step times (each the slower rank's), in ms."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    ranks = [ctx.Process(target=_rank, args=(r, port, case, bound, iterations, queue)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    steps = queue.get()
    for p in ranks:
        p.join()
    return [s * 1e3 for s in steps]


def spread(launches: list[list[float]]) -> dict[str, float]:
    medians = np.asarray([np.median(steps) for steps in launches])
    pooled = np.concatenate(launches)
    return {
        "launch_medians_ms": [round(float(m), 3) for m in medians],
        "median_ms": float(np.median(medians)),
        "sd_over_mean": float(medians.std() / medians.mean()),
        "max_over_min": float(medians.max() / medians.min()),
        "steps_p10_ms": float(np.percentile(pooled, 10)),
        "steps_p90_ms": float(np.percentile(pooled, 90)),
    }


def spread_text(key: str, s: dict, width: int) -> str:
    """One case's `spread` in a line, its name padded to `width`."""
    return (
        f"{key:{width}s} launch medians {s['launch_medians_ms']}: median {s['median_ms']:.2f} ms, "
        f"sd/mean {s['sd_over_mean']:.3f}, max/min {s['max_over_min']:.2f}; "
        f"steps p10-p90 {s['steps_p10_ms']:.2f}-{s['steps_p90_ms']:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=6, help="launches per case and binding")
    parser.add_argument("--iterations", type=int, default=20, help="timed steps per launch")
    parser.add_argument("--port", type=int, default=29600, help="first rendezvous port")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/core_binding.json"))
    args = parser.parse_args()
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < WORLD:
        parser.error(f"needs CPU affinity and at least {WORLD} cores to bind {WORLD} ranks apart")
    runs: dict[str, list[list[float]]] = {}
    port = args.port
    for k in range(args.launches):
        for name, case in CASES.items():
            for bound in (False, True) if k % 2 == 0 else (True, False):
                port += 1
                steps = launch(case, bound, port, args.iterations)
                runs.setdefault(f"{name} {'bound' if bound else 'unbound'}", []).append(steps)
                print(
                    f"launch {k} {name:4s} {'bound  ' if bound else 'unbound'} median {np.median(steps):7.2f} ms",
                    flush=True,
                )
    cases = {key: spread(launches) for key, launches in runs.items()}
    for key, s in cases.items():
        print(spread_text(key, s, 13))
    write_result(
        Path(args.out),
        {
            "command": " ".join(["python", *sys.argv]),
            "cores": sorted(os.sched_getaffinity(0)),
            "cases": cases,
            "launches": {key: [[round(t, 3) for t in steps] for steps in launches] for key, launches in runs.items()},
        },
    )


if __name__ == "__main__":
    main()

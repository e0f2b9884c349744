"""Is a layout's predicted peak memory right about what fits? Random transformer jobs, their
layouts run for real, each rank's measured peak against the policy's memory model, and how
often a memory cap would be called wrongly (the strategy-tree paper's anchor: 2 of 180).

    .venv/bin/python benchmarks/oom_prediction.py [--jobs 6] [--layouts 8] [--world-size 2] [--seed S]

Jobs are drawn from `--seed` (default: a fresh one, recorded), larger than the selection
benchmark's so that activations dominate the process's own memory (hidden 256-512, sequences
of 256-512 tokens, 4-8 of them a step). Per job, `--layouts` of its layouts (every family in
turn) run on gloo ranks on this machine's CPU (after one unmeasured small layout has taken the
process's one-time costs): each rank builds the layout under the profiler, takes one step, then
a measured one. Two peaks of that step, each over what was held before the layout was built:

- allocated: the most bytes torch's allocator held at once (the profiler's memory events,
  cumulated in time order), what torch.cuda.max_memory_allocated reports on a GPU and what
  an OOM depends on there. The OOM calls are counted on it.
- resident: the process's resident high water mark (/proc/self/clear_refs before the step,
  VmHWM after), with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_) so
  freed tensors leave rather than stay in the heap. It also holds gloo's and Python's own
  memory and misses pages an op never touched: a CPU's view, reported beside the other.

The job's cap is the geometric mean of its layouts' smallest and largest predicted peak, set
from the predictions alone; a layout's OOM call is wrong when predicted and measured peaks
fall on different sides of it.
Writes benchmarks/results/oom_prediction.json.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.parallelism_selection import family  # noqa: E402
from policies.parallelism import enumerate_layouts  # noqa: E402
from predictors.transformer_memory import transformer_memory  # noqa: E402
from probes.vocabulary.transformer_job import TransformerJob  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402

MEASURES = ("allocated", "resident")  # torch's allocations (the OOM call); the process's resident memory


def memory_job(index: int, world: int, seed: int) -> TransformerJob:
    rng = np.random.default_rng([seed, index, 104723])
    hidden = int(rng.choice([256, 512]))
    return TransformerJob(
        world_size=world,
        layers=int(rng.integers(2, 5)),
        hidden=hidden,
        heads=int(rng.choice([4, 8])),
        seq_len=int(rng.choice([256, 512])),
        global_batch=int(rng.choice([4, 8])),
        vocab_size=int(rng.choice([0, 8192])),
        dropout=0.1,
        seed=index,
        name=f"mem{index}",
    )


def pick_layouts(job: TransformerJob, count: int, seed: int) -> list[TransformerSpec]:
    """`count` layouts of the job, one family after another in a seeded order, so every kind
    (TP, PP, FSDP, micro-batches, recomputation) is tried across jobs."""
    by_family: dict[str, list[TransformerSpec]] = {}
    for spec in enumerate_layouts(job):
        by_family.setdefault(family(spec), []).append(spec)
    groups = list(by_family.values())
    np.random.default_rng([seed, job.seed]).shuffle(groups)
    picked: list[TransformerSpec] = []
    depth = 0
    while len(picked) < count and any(depth < len(g) for g in groups):
        picked += [g[depth] for g in groups if depth < len(g)][: count - len(picked)]
        depth += 1
    return picked


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _peak_rank(rank: int, world: int, specs: list[dict], tmp: str) -> None:

    import torch
    import torch.distributed as dist

    from probes.allocation_peak import step_allocation_peak
    from probes.workloads.transformer import ParallelTransformer

    torch.set_num_threads(1)
    libc = ctypes.CDLL("libc.so.6")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    warm = TransformerSpec.from_dict({**specs[0], "layers": specs[0]["pipeline_parallel"]})
    ParallelTransformer(warm, rank, torch.device("cpu")).step()  # the process's one-time costs, unmeasured
    peaks = []
    for data in specs:
        gc.collect()
        libc.malloc_trim(0)
        before = _status_kib("VmRSS")

        def settle() -> None:
            """Return the first step's and the initialisation's temporaries (each block drawn
            whole, then sliced), then reset the resident high water mark to the current RSS."""
            gc.collect()
            libc.malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")

        spec = TransformerSpec.from_dict(data)
        model, allocated = step_allocation_peak(
            lambda: ParallelTransformer(spec, rank, torch.device("cpu")),  # noqa: B023 (called at once)
            lambda m: m.step(),
            between=settle,
        )
        resident = (_status_kib("VmHWM") - before) * 1024
        peaks.append({"allocated": allocated, "resident": resident})
        model.close()
        del model
    Path(f"{tmp}/{rank}.json").write_text(json.dumps(peaks))
    dist.barrier()
    os._exit(0)


def measure_peaks(specs: list[TransformerSpec], world: int) -> list[dict[str, int]]:
    """Per layout, the largest rank's measured peaks (bytes): torch's allocations, and the
    process's resident memory."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_peak_rank, args=(world, [s.to_dict() for s in specs], tmp), nprocs=world)
        per_rank = [json.loads(Path(f"{tmp}/{r}.json").read_text()) for r in range(world)]
    return [{k: max(rank[k] for rank in ranks) for k in ("allocated", "resident")} for ranks in zip(*per_rank)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--layouts", type=int, default=8, help="layouts tried per job")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None, help="job seed (default: a fresh one, recorded)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/oom_prediction.json"))
    args = parser.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by each spawned rank's glibc
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    print(f"{args.jobs} jobs drawn with --seed {args.seed}", flush=True)
    jobs: list[dict] = []
    wrong = {measure: 0 for measure in MEASURES}
    ratios: dict[str, list[float]] = {measure: [] for measure in MEASURES}
    for i in range(args.jobs):
        job = memory_job(i, args.world_size, args.seed)
        specs = pick_layouts(job, args.layouts, args.seed)
        predicted = [transformer_memory(s).peak for s in specs]
        cap = math.sqrt(min(predicted) * max(predicted))
        measured = measure_peaks(specs, args.world_size)
        rows = []
        for spec, p, m in zip(specs, predicted, measured):
            row: dict[str, Any] = {"layout": spec.layout, "family": family(spec), "predicted_bytes": p}
            for measure in MEASURES:
                miss = (p > cap) != (m[measure] > cap)
                wrong[measure] += miss
                ratios[measure].append(m[measure] / p)
                row[f"{measure}_bytes"] = m[measure]
                row[f"wrong_{measure}"] = miss
            rows.append(row)
        print(
            f"{job.name}: cap {cap / 2**20:.0f} MiB; allocated/predicted "
            + ", ".join(f"{r['layout']} {r['allocated_bytes'] / r['predicted_bytes']:.2f}" for r in rows),
            flush=True,
        )
        jobs.append({"job": job.to_dict(), "cap_bytes": cap, "layouts": rows})
    summary = {
        "layouts_tried": sum(len(j["layouts"]) for j in jobs),
        **{
            measure: {
                "wrong_oom_calls": wrong[measure],
                "measured_over_predicted": {
                    "median": float(np.median(ratios[measure])),
                    "min": float(np.min(ratios[measure])),
                    "max": float(np.max(ratios[measure])),
                },
            }
            for measure in MEASURES
        },
    }
    print(json.dumps(summary, indent=1))
    command = f"benchmarks/oom_prediction.py --jobs {args.jobs} --layouts {args.layouts} "
    command += f"--world-size {args.world_size} --seed {args.seed}"
    print(f"wrote {write_result(args.out, {'command': command, 'seed': args.seed, 'summary': summary, 'jobs': jobs})}")


if __name__ == "__main__":
    main()

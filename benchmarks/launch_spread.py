"""How much one e2e task's step time moves within a launch and between launches.

    .venv/bin/python benchmarks/launch_spread.py --seed S --pick 9,3 --launches 4

Draws the DLRM e2e benchmark's tasks (`benchmarks/e2e_accuracy.py`, full size, 2 ranks) from
`--seed`, and launches each picked task `--launches` times through the Ray Train launcher
(20 timed iterations each, as the benchmark does), keeping every iteration's time. Says
whether a task measured far from its prediction is a slow launch (the iterations of one
launch alike, launches apart) or a wide spread of steps inside every launch (then more
launches do not move the median, and the prediction misses the typical step). Writes
benchmarks/results/launch_spread.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.e2e_accuracy import task_plan, write_result  # noqa: E402
from orchestrator import ray_runtime  # noqa: E402
from orchestrator.launch import launch_dlrm  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True, help="the e2e run's task seed")
    parser.add_argument("--tasks", type=int, default=12, help="tasks drawn (as the e2e benchmark draws them)")
    parser.add_argument("--pick", default="0", help="which of the drawn tasks to launch")
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/launch_spread.json"))
    args = parser.parse_args()
    tasks = random_dlrm_tasks(args.tasks, 2, args.seed, 1.0)
    picks = [int(i) for i in args.pick.split(",")]
    ray_runtime.connect()
    launches = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.launches):
            for i in picks:
                _, plan = task_plan(i, tasks[i], args.seed)
                run = launch_dlrm(tasks[i], plan, iterations=args.iterations, storage=Path(tmp) / "ray_results")
                steps = np.asarray(run.per_iteration_ms)
                print(
                    f"launch {k} {tasks[i].name} B={tasks[i].batch_size}: median {run.iteration_ms:.2f} ms, "
                    f"p10 {np.percentile(steps, 10):.2f}, p90 {np.percentile(steps, 90):.2f}",
                    flush=True,
                )
                launches.append(
                    {"launch": k, "task": i, "median_ms": run.iteration_ms, "steps_ms": run.per_iteration_ms}
                )
    summary = {}
    for i in picks:
        mine = [x for x in launches if x["task"] == i]
        medians = [x["median_ms"] for x in mine]
        pooled = np.concatenate([x["steps_ms"] for x in mine])
        summary[tasks[i].name] = {
            "launch_medians_ms": medians,
            "launch_spread": max(medians) / min(medians) - 1,
            "pooled_median_ms": float(np.median(pooled)),
            "pooled_p10_p90_ms": [float(np.percentile(pooled, 10)), float(np.percentile(pooled, 90))],
        }
        s = summary[tasks[i].name]
        print(
            f"{tasks[i].name}: launch medians {', '.join(f'{m:.2f}' for m in medians)} (spread {s['launch_spread']:.1%}); "
            f"all {len(pooled)} steps: median {s['pooled_median_ms']:.2f}, p10-p90 "
            f"{s['pooled_p10_p90_ms'][0]:.2f}-{s['pooled_p10_p90_ms'][1]:.2f} ms"
        )
    command = f"python benchmarks/launch_spread.py --seed {args.seed} --tasks {args.tasks} --pick {args.pick} "
    command += f"--launches {args.launches} --iterations {args.iterations}"
    out = write_result(args.out, {"command": command, "summary": summary, "launches": launches})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

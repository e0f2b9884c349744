"""The same training step timed two ways, side by side: as the calibration's training probe times
it (a gang of probe actors) and as the real job runs (`orchestrator.launch`, Ray Train).

    .venv/bin/python benchmarks/launch_vs_probe.py [--seed S] [--pick 4,9,11] [--rounds 3]
    .venv/bin/python benchmarks/launch_vs_probe.py --workload transformer --seed S --pick 4,6

With `--workload transformer` the tasks are `benchmarks/e2e_accuracy_transformer.py`'s
data-parallel draw for the seed.

The step model is fitted on the probe's steps and judged on the launcher's; a step that runs
slower under the launcher than in the probe is time no calibration row can show. For each
picked task of `benchmarks/e2e_accuracy.py`'s draw (same seed, sharders in turn, full size),
each round times it once each way (probe first, then launcher, alternating the order every
round so host drift falls on both); reports per task the median of each way's medians and
their ratio (launcher / probe) with its spread over the rounds, and over the tasks the geomean
of their median ratios with its 95% interval (`launch_share`). Writes
benchmarks/results/launch_vs_probe.json (launch_vs_probe_transformer.json).

Whether either way's times depend on how warm its processes are (`warmth`): with
`--probe-repeats N` each probe round times the step N times on the same gang, the first on
freshly started actors and the rest on warm ones (warm / fresh, each round's median of the
repeats after the first over its first); each launch's steps are split into thirds (later /
first, the median of its last third over that of its first). A launched job's workers are
always fresh, so a warm-over-fresh ratio far from 1 would be time the probe and the job see
differently.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import task_plan, write_result  # noqa: E402
from benchmarks.e2e_accuracy_transformer import data_parallel_tasks  # noqa: E402
from orchestrator import ray_runtime  # noqa: E402
from orchestrator.cluster import cluster_fingerprint  # noqa: E402
from orchestrator.launch import launch_dlrm, launch_transformer  # noqa: E402
from orchestrator.probe_pool import ActorPool, Gang  # noqa: E402
from predictors.evaluation import error_stats  # noqa: E402
from probes.probe import ProbeSpec  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP, TRANSFORMER_STEP_OP  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def gang_step_s(gang: Gang, params: dict, step_op: str) -> float:
    """One training probe with `params` (a DLRM job and its plan, or a transformer) on a formed
    gang, as the calibration's training phase runs it: its step's median seconds."""
    rows = gang.run([gang.placed(ProbeSpec("training", params, "train:x"))])
    (step,) = [r for r in rows if r.op == step_op]
    return step.median_s


@contextmanager
def formed_gang(device_kind: str, hardware_id: str, world: int) -> Iterator[Gang]:
    """A fresh pool of probe actors and its gang, formed; the pool (and the devices it holds)
    given back on leaving, whatever happened inside."""
    pool = ActorPool(device_kind, hardware_id, world).start()
    try:
        gang = Gang(pool)
        gang.form()
        yield gang
        gang.disband()
    finally:
        pool.stop()


def probe_step_ms(hardware_id: str, world: int, params: dict, step_op: str) -> float:
    """The task's step as the calibration times it, on a fresh pool and gang (`gang_step_s`)."""
    return probe_steps_ms(hardware_id, world, params, step_op, 1)[0]


def probe_steps_ms(hardware_id: str, world: int, params: dict, step_op: str, repeats: int) -> list[float]:
    """The task's step as the calibration times it (`gang_step_s`), `repeats` times in a row on
    one fresh pool and gang: the first on freshly started actors, the rest on warm ones."""
    with formed_gang("cpu", hardware_id, world) as gang:
        return [gang_step_s(gang, params, step_op) * 1e3 for _ in range(repeats)]


def dlrm_task(i: int, spec, seed: int, iterations: int, storage: Path):
    """A DLRM task of the e2e draw: its probe params, step op and launch (its `LaunchResult`)."""
    _, plan = task_plan(i, spec, seed)
    params = {"job": spec.to_dict(), "table_to_rank": list(plan)}
    return params, DLRM_STEP_OP, lambda: launch_dlrm(spec, plan, iterations=iterations, storage=storage)


def transformer_task(spec, iterations: int, storage: Path):
    """A transformer task of the e2e draw: its probe params, step op and launch (its `LaunchResult`)."""
    params = {"transformer": spec.to_dict()}
    return params, TRANSFORMER_STEP_OP, lambda: launch_transformer(spec, iterations=iterations, storage=storage)


def later_over_first(per_iteration_ms: list[float]) -> float | None:
    """A launch's steps split into thirds: the median of the last third over the median of the
    first (None under three steps), whether the job's own steps speed up as its workers warm."""
    third = len(per_iteration_ms) // 3
    if third == 0:
        return None
    return statistics.median(per_iteration_ms[-third:]) / statistics.median(per_iteration_ms[:third])


def warmth(probe_repeats_ms: list[list[float]], launch_steps_ms: list[list[float]]) -> dict:
    """Over every round of every task: the probe's warm / fresh (each round's median of its
    repeats after the first over its first; none with one repeat) and the launch's later /
    first thirds (`later_over_first`), each as the geomean of the rounds' ratios with its 95%
    interval (`error_stats`)."""

    probe = [statistics.median(r[1:]) / r[0] for r in probe_repeats_ms if len(r) > 1]
    launch = [x for x in (later_over_first(steps) for steps in launch_steps_ms) if x is not None]
    return {
        "probe_warm_over_fresh": ratio_geomean(probe, "rounds") if probe else None,
        "launch_later_over_first": ratio_geomean(launch, "rounds") if launch else None,
    }


def ratio_geomean(ratios: list[float], counted: str) -> dict:
    """The geomean of positive ratios with the 95% t-interval of its log (none from one ratio;
    `error_stats`, as gang_history.py's ratios) and their count under the key `counted`."""
    stats = error_stats(np.asarray(ratios, dtype=np.float64))
    return {"geomean": stats.gmae, "low": stats.gmae_low, "high": stats.gmae_high, counted: stats.n}


def shown(summary: dict) -> str:
    """A `ratio_geomean` as printed: "1.050 [0.928, 1.188]", or the geomean alone without an interval."""
    interval = f" [{summary['low']:.3f}, {summary['high']:.3f}]" if summary["low"] is not None else ""
    return f"{summary['geomean']:.3f}{interval}"


def launch_share(ratios: list[float]) -> dict:
    """Over the tasks, the geomean of their launcher/probe ratios with its 95% interval
    (`ratio_geomean`): how much slower a launched step runs than the probe's."""
    return ratio_geomean(ratios, "tasks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1921151714, help="the e2e benchmark's task seed")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--pick", default="4,9,11")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--workload", choices=("dlrm", "transformer"), default="dlrm")
    parser.add_argument(
        "--probe-repeats",
        type=int,
        default=1,
        help="times each probe round times the step on its one gang (the first fresh, the rest warm); "
        "the probe's time is the first",
    )
    parser.add_argument("--out", help="default: benchmarks/results/launch_vs_probe[_transformer].json")
    args = parser.parse_args()
    if args.probe_repeats < 1:
        parser.error(f"--probe-repeats must be >= 1, got {args.probe_repeats}")
    suffix = "" if args.workload == "dlrm" else "_transformer"
    out = args.out or str(REPO / f"benchmarks/results/launch_vs_probe{suffix}.json")

    ray_runtime.connect()
    fingerprint = cluster_fingerprint()
    picked = {int(i) for i in args.pick.split(",")}
    if args.workload == "dlrm":
        drawn = random_dlrm_tasks(args.tasks, 2, args.seed, 1.0)
    else:
        drawn = data_parallel_tasks(args.tasks, 2, args.seed)
    tasks = [(i, s) for i, s in enumerate(drawn) if i in picked]
    rows, all_repeats, all_steps = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in tasks:
            storage = Path(tmp) / "r"
            if args.workload == "dlrm":
                params, step_op, launch = dlrm_task(i, spec, args.seed, args.iterations, storage)
            else:
                params, step_op, launch = transformer_task(spec, args.iterations, storage)
            probe, launched, repeats, steps = [], [], [], []
            for k in range(args.rounds):
                for way in ("probe", "launch") if k % 2 == 0 else ("launch", "probe"):
                    t0 = time.monotonic()
                    if way == "probe":
                        repeats.append(
                            probe_steps_ms(
                                fingerprint.hardware_id, spec.world_size, params, step_op, args.probe_repeats
                            )
                        )
                        probe.append(repeats[-1][0])
                    else:
                        result = launch()
                        launched.append(result.iteration_ms)
                        steps.append(result.per_iteration_ms)
                    print(
                        f"{spec.name} round {k} {way}: {(probe if way == 'probe' else launched)[-1]:.2f} ms "
                        f"({time.monotonic() - t0:.0f} s)",
                        flush=True,
                    )
            ratios = [a / b for a, b in zip(launched, probe)]
            row = {
                "name": spec.name,
                "batch_size": spec.batch_size,
                "spec": spec.to_dict(),
                "probe_ms": probe,
                "launch_ms": launched,
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "probe_repeats_ms": repeats,
                "launch_later_over_first": [later_over_first(x) for x in steps],
            }
            all_repeats += repeats
            all_steps += steps
            rows.append(row)
            print(
                f"{spec.name}: launcher/probe {row['ratio_median']:.3f} [{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]",
                flush=True,
            )
    ray_runtime.shutdown()
    share = launch_share([row["ratio_median"] for row in rows])
    print(f"launcher/probe over {share['tasks']} tasks: geomean {shown(share)}", flush=True)
    warm = warmth(all_repeats, all_steps)
    for key, value in warm.items():
        if value is not None:
            print(f"{key.replace('_', ' ')} over {value['rounds']} rounds: geomean {shown(value)}")
    write_result(
        out,
        {
            "hardware_id": fingerprint.hardware_id,
            "command": (
                f"python benchmarks/launch_vs_probe.py --workload {args.workload} --seed {args.seed} "
                f"--pick {args.pick} --rounds {args.rounds} --iterations {args.iterations} "
                f"--probe-repeats {args.probe_repeats}"
            ),
            "tasks": rows,
            "launch_share": share,
            "warmth": warm,
        },
    )


if __name__ == "__main__":
    main()

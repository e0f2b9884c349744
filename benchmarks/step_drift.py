"""A calibration's own task steps timed again, beside fresh tasks, against the champion: does a
run's lean come from the jobs (fresh ones unlike the calibration's) or from the host (the
calibration's own steps slower now than when it measured them)?

    .venv/bin/python benchmarks/step_drift.py --tracking-uri URI --calibration-dir DIR
        [--fresh-seed S] [--fresh 8] [--rounds 2]

The calibration's table-wise task-shaped training steps (its `dlrm_step` rows named `task*`
with a table-wise plan, the kind of plan a run's tasks have) and `--fresh` tasks of
`benchmarks/e2e_accuracy.py`'s draw for `--fresh-seed` (default: a fresh one, recorded), each
timed `--rounds` times as the calibration times a training probe (a fresh gang of probe
actors, `benchmarks/launch_vs_probe.probe_step_ms`), in rounds whose order alternates, so
host drift within the run falls on both sets. Reports per step the champion's prediction,
its time now (median over rounds), the calibration's stored time, and per set the mean
signed error. The kernel host check (`benchmarks/host_drift.py`) re-times single kernels; a
step of two ranks on a shared host can slow when those do not, and this shows it. Writes
benchmarks/results/step_drift.json (or `--out`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import task_plan, write_result  # noqa: E402
from benchmarks.launch_vs_probe import probe_step_ms  # noqa: E402
from benchmarks.step_checks import own_steps  # noqa: E402
from orchestrator import ray_runtime, registry  # noqa: E402
from orchestrator.cluster import cluster_fingerprint  # noqa: E402
from predictors.dlrm_estimator import estimate_iteration  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def calibration_steps(directory: Path) -> list[dict]:
    """The calibration's table-wise task-shaped steps (`step_checks.own_steps`):
    job, plan and stored time; none when it has none."""
    try:
        rows = own_steps(directory, "dlrm")
    except ValueError:
        return []
    return [
        {
            "set": "calibration",
            "job": r.params["job"],
            "plan": list(r.params["table_to_rank"]),
            "stored_ms": r.median_s * 1e3,
        }
        for r in rows
    ]


def fresh_steps(seed: int, n: int, world: int) -> list[dict]:
    """`n` tasks of the DLRM benchmark's draw for `seed` on `world` ranks, each under its sharder's plan."""
    return [
        {"set": "fresh", "job": spec.to_dict(), "plan": list(task_plan(i, spec, seed)[1]), "stored_ms": None}
        for i, spec in enumerate(random_dlrm_tasks(n, world, seed, 1.0))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", required=True, help="where the calibration registered its champion")
    parser.add_argument("--calibration-dir", type=Path, required=True, help="its directory (measurements.jsonl)")
    parser.add_argument("--fresh-seed", type=int, help="the fresh tasks' seed (default: a fresh one, recorded)")
    parser.add_argument("--fresh", type=int, default=8, help="how many fresh tasks")
    parser.add_argument("--rounds", type=int, default=2, help="times each step is timed")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_drift.json"))
    args = parser.parse_args()
    if not (args.calibration_dir / "measurements.jsonl").is_file():
        parser.error(f"--calibration-dir: no measurements.jsonl in {args.calibration_dir}")
    if args.fresh < 1 or args.rounds < 1:
        parser.error(f"--fresh and --rounds: expected counts >= 1, got {args.fresh} and {args.rounds}")
    seed = args.fresh_seed if args.fresh_seed is not None else random.SystemRandom().randrange(2**31)
    calibrated = calibration_steps(args.calibration_dir)
    if not calibrated:
        parser.error(f"--calibration-dir: {args.calibration_dir} has no table-wise task-shaped DLRM steps")
    world = int(calibrated[0]["job"]["world_size"])  # the calibration's gangs, and the fresh tasks'
    steps = calibrated + fresh_steps(seed, args.fresh, world)
    registry.configure(args.tracking_uri)
    ray_runtime.connect()
    fingerprint = cluster_fingerprint()
    model = registry.load_performance_model(args.tracking_uri, fingerprint.hardware_id)
    times: list[list[float]] = [[] for _ in steps]
    for k in range(args.rounds):
        order = list(range(len(steps)))
        for i in order if k % 2 == 0 else reversed(order):
            params = {"job": steps[i]["job"], "table_to_rank": steps[i]["plan"]}
            times[i].append(probe_step_ms(fingerprint.hardware_id, world, params, DLRM_STEP_OP))
            print(
                f"round {k + 1}/{args.rounds} {steps[i]['set']:11s} {steps[i]['job']['name']:9s} {times[i][-1]:7.2f} ms",
                flush=True,
            )
    ray_runtime.shutdown()
    for step, measured in zip(steps, times):
        spec = JobSpec.from_dict(step["job"])
        step["predicted_ms"] = estimate_iteration(spec, step["plan"], model).iteration_s * 1e3
        step["now_ms"] = statistics.median(measured)
        step["rounds_ms"] = measured
        step["error"] = (step["predicted_ms"] - step["now_ms"]) / step["now_ms"]
        stored = f"{step['stored_ms']:7.2f}" if step["stored_ms"] is not None else "      –"
        print(
            f"{step['set']:11s} {spec.name:9s} B={spec.batch_size:4d} T={len(spec.tables):2d} predicted "
            f"{step['predicted_ms']:7.2f}  now {step['now_ms']:7.2f} ({step['error']:+.1%})  stored {stored}"
        )
    summary = {}
    for name in ("calibration", "fresh"):
        errors = [s["error"] for s in steps if s["set"] == name]
        summary[name] = {"mean_signed_error": statistics.fmean(errors), "n": len(errors)}
        print(f"{name}: mean signed {summary[name]['mean_signed_error']:+.1%} over {len(errors)} steps")
    slowdown = [s["now_ms"] / s["stored_ms"] for s in steps if s["stored_ms"]]
    summary["calibration_now_over_stored_median"] = statistics.median(slowdown)
    print(f"the calibration's steps now / as stored: median {summary['calibration_now_over_stored_median']:.3f}")
    result = {
        "hardware_id": fingerprint.hardware_id,
        "command": f"python benchmarks/step_drift.py --tracking-uri URI --calibration-dir DIR --fresh-seed {seed} "
        f"--fresh {args.fresh} --rounds {args.rounds}",
        "calibration_dir": str(args.calibration_dir),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fresh_seed": seed,
        "steps": steps,
        "summary": summary,
    }
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

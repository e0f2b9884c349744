"""Benchmark the whole autotune cycle on this machine, from nothing.

    .venv/bin/python benchmarks/autotune_cycle.py [--job examples/dlrm_small.yaml] [--budget-s 120]

In a scratch directory (its own sqlite MLflow): autotune with a fresh calibration, then the
plan's job launched again `--repeats` times to show run-to-run spread of the measured time.
Prints a table and writes benchmarks/results/autotune_cycle_<hardware_id>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli(module: str, *args: str, cwd: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"{module} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=str(REPO / "examples/dlrm_small.yaml"))
    parser.add_argument("--budget-s", type=float, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    job = str(Path(args.job).resolve())

    with tempfile.TemporaryDirectory() as scratch:
        t0 = time.time()
        first = cli("orchestrator.autotune", "--job", job, "--calibration-budget-s", str(args.budget_s), cwd=scratch)
        cycle_s = time.time() - t0
        plan = str(Path(scratch) / first["plan"])
        reruns = [
            cli("orchestrator.cli.run", "--job", job, "--plan", plan, cwd=scratch)["iteration_ms"]
            for _ in range(args.repeats)
        ]
        t1 = time.time()
        second = cli("orchestrator.autotune", "--job", job, "--dry-run", cwd=scratch)
        reuse_s = time.time() - t1

    cal = first["calibration"]
    result = {
        "hardware_id": first["hardware_id"],
        "job": Path(job).name,
        "command": f"python benchmarks/autotune_cycle.py --budget-s {args.budget_s:g} --repeats {args.repeats}",
        "calibration": {
            "budget_s": args.budget_s,
            "wall_s": cal["wall_s"],
            "rows_per_op": cal["rows_per_op"],
            "failures": cal["failures"],
            "heldout": cal["heldout"],
        },
        "sharding_choice": first["sharding"],
        "predicted_iteration_ms": first["predicted_iteration_ms"],
        "measured_iteration_ms": first["measured_iteration_ms"],
        "prediction_error": first["prediction_error"],
        "rerun_iteration_ms": reruns,
        "rerun_spread": (max(reruns) - min(reruns)) / statistics.median(reruns) if reruns else None,
        "error_vs_rerun_median": abs(first["predicted_iteration_ms"] - statistics.median(reruns))
        / statistics.median(reruns)
        if reruns
        else None,
        "first_autotune_wall_s": round(cycle_s, 1),
        "second_autotune_dry_run_wall_s": round(reuse_s, 1),
        "second_recalibrated": second["recalibrated"],
    }
    out = REPO / "benchmarks/results" / f"autotune_cycle_{first['hardware_id']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))

    print(f"hardware {result['hardware_id']}  job {result['job']}")
    print(f"{'op':16s} {'rows':>6s} {'held-out GMAE':>14s} {'MAPE':>8s} {'baseline GMAE':>14s}")
    for op, s in cal["heldout"].items():
        base = f"{s['baseline_gmae']:.1%}" if s.get("baseline_gmae") is not None else "-"
        print(f"{op:16s} {cal['rows_per_op'].get(op, 0):6d} {s['gmae']:14.1%} {s['mape']:8.1%} {base:>14s}")
    print(
        f"sharder {result['sharding_choice']}: predicted {result['predicted_iteration_ms']:.2f} ms, "
        f"measured {result['measured_iteration_ms']:.2f} ms (error {result['prediction_error']:.1%}); "
        f"re-runs {', '.join(f'{x:.2f}' for x in reruns)} ms"
    )
    print(
        f"first autotune {result['first_autotune_wall_s']}s (calibration {cal['wall_s']}s); "
        f"second (reuses champion: {not result['second_recalibrated']}) {result['second_autotune_dry_run_wall_s']}s"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

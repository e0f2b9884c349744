"""The drift drill: calibrate, then let the nightly find (or not find) drift, through the real CLIs.

    .venv/bin/python benchmarks/drift_drill.py [--budget-s 25] [--slowdown 3]

In a scratch directory with its own sqlite MLflow: a calibration; a nightly on the unchanged
machine (expected: sentinels within their bound, nothing recalibrated); a nightly with every
probe reading `--slowdown` times slower (AUTOTUNE_DRILL_SLOWDOWN; expected: sentinel drift,
recalibration, the new version promoted); the same drill again (expected: the new champion's
sentinels hold). Prints each step's sentinel GMAE against its bound and what the nightly did,
and writes benchmarks/results/drift_drill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli(module: str, args: list[str], cwd: str, drill: float | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    for key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "AUTOTUNE_DRILL_SLOWDOWN"):
        env.pop(key, None)
    if drill is not None:
        env["AUTOTUNE_DRILL_SLOWDOWN"] = str(drill)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(f"{module} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=25.0, help="each calibration's probe budget")
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "drift_drill.json"))
    args = parser.parse_args()
    budget = ["--budget-s", str(args.budget_s)]
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        calibration = cli("orchestrator.cli.calibrate", budget, tmp)
        print(f"calibrated {calibration['model']} in {calibration['wall_s']} s")
        for label, drill in (
            ("unchanged machine", None),
            (f"drill x{args.slowdown:g}", args.slowdown),
            (f"drill x{args.slowdown:g} again", args.slowdown),
        ):
            summary = cli("orchestrator.cli.nightly", budget, tmp, drill)
            (checked,) = summary["checked"]
            sentinel = checked["sentinel"]
            step = {
                "step": label,
                "checked": checked["champion"],
                "sentinel_gmae": sentinel["gmae"],
                "bound": sentinel["bound"],
                "champion_heldout_gmae": sentinel["expected_gmae"],
                "recalibrated": checked["recalibrated"],
                "promoted": checked["promoted"],
                "new_model": checked.get("model"),
                "wall_s": summary["wall_s"],
            }
            steps.append(step)
            did = (
                f"recalibrated -> {step['new_model']} ({'promoted' if step['promoted'] else 'challenger'})"
                if step["recalibrated"]
                else "nothing recalibrated"
            )
            print(
                f"{label:22s} champion {step['checked']}: sentinel GMAE {step['sentinel_gmae']:.1%} "
                f"(stale above {step['bound']:.1%}) -> {did} [{step['wall_s']} s]"
            )
        drift = cli("orchestrator.cli.drift", [], tmp)
        wall = time.monotonic() - t0
    out = {
        "command": "benchmarks/drift_drill.py"
        + (f" --budget-s {args.budget_s:g}" if args.budget_s != 25 else "")
        + (f" --slowdown {args.slowdown:g}" if args.slowdown != 3 else ""),
        "calibration": {k: calibration[k] for k in ("hardware_id", "model", "promoted", "wall_s")},
        "steps": steps,
        "sentinel_history": drift["hardware"][calibration["hardware_id"]]["sentinel"],
        "wall_s": round(wall, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

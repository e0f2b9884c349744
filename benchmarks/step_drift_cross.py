"""Each calibration's champion priced against every stored `step_drift.py` run's steps: is a
calibration's own step set predicted better than other jobs because the model saw it, or are
its jobs faster ones?

    .venv/bin/python benchmarks/step_drift_cross.py --run URI STEP_DRIFT_JSON [--run URI JSON ...]

Each `--run` names the store whose champion a `benchmarks/step_drift.py` run priced and that
run's JSON (its calibration's own table-wise task steps and fresh tasks, timed side by side).
Every champion prices every run's steps as measured there, so a set is judged by a model
that fitted it (its own calibration's steps), by one that never saw those jobs (the other
calibration's steps), and on fresh jobs; the difference between a champion's own steps and
another calibration's, measured the same way, is what fitting them bought. Prints per
champion and set the mean signed error with its 95% interval, split by batch (128-256 against
512-1024: a step's fixed costs weigh most on the small ones). Writes
benchmarks/results/step_drift_cross.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import signed_summary, write_result  # noqa: E402
from predictors.dlrm_estimator import estimate_iteration  # noqa: E402
from predictors.evaluation import geomean  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402

SMALL_BATCHES = (128, 256)


def signed(steps: list[dict]) -> dict | None:
    """The steps' mean signed error with its 95% interval (`e2e_accuracy.signed_summary`) and
    their count; None when there are none."""
    return {**signed_summary(steps), "n": len(steps)} if steps else None


def priced(model, steps: list[dict]) -> list[dict]:
    """Each measured step with this model's prediction and signed error."""
    out = []
    for step in steps:
        predicted = estimate_iteration(JobSpec.from_dict(step["job"]), step["plan"], model).iteration_s * 1e3
        out.append(
            {
                "name": step["job"]["name"],
                "batch_size": step["job"]["batch_size"],
                "predicted_ms": predicted,
                "measured_ms": step["now_ms"],
                "error": (predicted - step["now_ms"]) / step["now_ms"],
            }
        )
    return out


def text(summary: dict | None) -> str:
    if summary is None:
        return "      –            n= 0"
    low, high = summary["mean_signed_interval"] or (float("nan"), float("nan"))
    return f"{summary['mean_signed_error']:+6.1%} [{low:+.1%}, {high:+.1%}] n={summary['n']:2d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--run", nargs=2, action="append", required=True, metavar=("URI", "STEP_DRIFT_JSON"), help="a run and its store"
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_drift_cross.json"))
    args = parser.parse_args()
    runs = []
    for uri, path in args.run:
        if not Path(path).is_file():
            parser.error(f"--run: no step_drift JSON at {path}")
        data = json.loads(Path(path).read_text())
        if not data.get("steps") or "now_ms" not in data["steps"][0]:
            parser.error(f"--run: {path} is not a step_drift.py result (expected 'steps' with 'now_ms')")
        runs.append({"uri": uri, "label": Path(path).stem, "data": data})

    from orchestrator import registry

    rows = []
    for champion in runs:
        registry.configure(champion["uri"])
        model = registry.load_performance_model(champion["uri"], champion["data"]["hardware_id"])
        for run in runs:
            for kind in ("calibration", "fresh"):
                steps = priced(model, [s for s in run["data"]["steps"] if s["set"] == kind])
                if not steps:
                    continue
                row = {
                    "champion": champion["label"],
                    "steps": f"{run['label']}:{kind}",
                    "own": champion is run and kind == "calibration",
                    "all": signed(steps),
                    "small_batches": signed([s for s in steps if s["batch_size"] in SMALL_BATCHES]),
                    "large_batches": signed([s for s in steps if s["batch_size"] not in SMALL_BATCHES]),
                    "geomean_error": geomean([abs(s["error"]) for s in steps]),
                    "priced": steps,
                }
                rows.append(row)
                print(
                    f"champion of {champion['label']:16s} on {row['steps']:28s}{' (its own)' if row['own'] else '          '}"
                    f" signed {text(row['all'])}  B<=256 {text(row['small_batches'])}  B>=512 {text(row['large_batches'])}"
                    f"  geomean |error| {row['geomean_error']:.1%}",
                    flush=True,
                )
    command = "python benchmarks/step_drift_cross.py " + " ".join(f"--run URI {path}" for _, path in args.run)
    print(f"wrote {write_result(args.out, {'command': command, 'rows': rows})}")


if __name__ == "__main__":
    main()

"""The DLRM step overhead fitted on every measured step (as the calibration fitted it until
12-03; `every_dlrm_step`), against
fitted on the steps of the job space alone (every step but the calibration's small random
DLRMs for the framework's overheads, `ops.framework_job`), side by side on stored
calibrations and the end-to-end runs made against them. Tried for #26 on 11-28 and dropped:
on three calibrations the job space's steps left out in turn came out worse in two, the runs'
tasks leaned 1 point less but their geomean rose (README, `step_fit_space.json`).

    .venv/bin/python benchmarks/step_fit_space.py ROWS RESULT [ROWS RESULT ...] [--out JSON]

ROWS: a calibration's stored rows (`measurements.jsonl[.gz]`); RESULT: the
`benchmarks/e2e_accuracy.py` run against it. Fits each calibration's bundle as the calibration
would now (`predictors.fit.fit_bundle`, a few minutes each), then its DLRM step overhead twice
on the same kernels: on every step, and on the steps of the job space. Reports per
calibration and over all: the job space's steps, each left out in turn, and the run's tasks
(geomean, max, mean signed). The tasks' times are one spell's: only the overhead differs.
Writes benchmarks/results/step_fit_space.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import error_summary, write_result  # noqa: E402
from benchmarks.refit_e2e import dlrm_predictions, read_rows  # noqa: E402
from predictors.dlrm_estimator import OVERHEAD_FEATURES, step_residuals  # noqa: E402
from predictors.evaluation import leave_one_out_signed  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.opmodels import step_overhead_fitter  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP, framework_job  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

CHOICES = ("every_step", "job_space")


def judged_choice(model: PerformanceModel, steps: Sequence[Measurement], result: dict) -> dict[str, dict[str, Any]]:
    """Per choice of the steps the overhead is fitted on: the job space's steps, each predicted
    by an overhead fitted on that choice's other steps (`leave_one_out_signed`), and the run's
    tasks under the overhead fitted on all of that choice's steps."""
    kernels, residuals = step_residuals(model, steps)
    in_space = [not framework_job(r.params["job"]) for r in steps]
    out = {}
    for choice in CHOICES:
        fitted_on = [i for i in range(len(steps)) if choice == "every_step" or in_space[i]]
        fit = step_overhead_fitter(DLRM_OVERHEAD_OP, OVERHEAD_FEATURES, len(fitted_on))  # as `fit_step_overhead` judges
        signed = leave_one_out_signed(
            [residuals[i] for i in fitted_on],
            [kernels[i] for i in fitted_on],
            [steps[i].median_s for i in fitted_on],
            fit,
        )
        left_out = [e for i, e in zip(fitted_on, signed) if in_space[i]]
        model.step_overheads["dlrm"] = fit([residuals[i] for i in fitted_on])
        tasks = [(t["predicted_ms"] - t["measured_ms"]) / t["measured_ms"] for t in dlrm_predictions(model, result)]
        out[choice] = {
            "fitted_steps": len(fitted_on),
            "steps_left_out": {
                **error_summary([abs(e) for e in left_out]),
                "mean_signed_error": float(np.mean(left_out)),
                "n": len(left_out),
            },
            "tasks": {
                **error_summary([abs(e) for e in tasks]),
                "mean_signed_error": float(np.mean(tasks)),
                "signed_errors": tasks,
            },
        }
    return out


def pooled(calibrations: list[dict]) -> dict[str, dict[str, float]]:
    """Per choice, every run's tasks together, and how many calibrations' runs leaned less."""
    out = {}
    for choice in CHOICES:
        signed = [e for c in calibrations for e in c["choices"][choice]["tasks"]["signed_errors"]]
        out[choice] = {**error_summary([abs(e) for e in signed]), "mean_signed_error": float(np.mean(signed))}
    out["runs_leaning_less_on_job_space"] = sum(
        abs(c["choices"]["job_space"]["tasks"]["mean_signed_error"])
        < abs(c["choices"]["every_step"]["tasks"]["mean_signed_error"])
        for c in calibrations
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", type=Path, nargs="+", help="ROWS RESULT, one pair per calibration")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_fit_space.json"))
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error(f"pairs: expected ROWS RESULT pairs, got {len(args.pairs)} paths")
    calibrations = []
    for rows_path, result_path in zip(args.pairs[::2], args.pairs[1::2]):
        rows = read_rows(rows_path)
        result = json.loads(result_path.read_text())
        model, _ = fit_bundle(rows, "refit", seed=0)
        steps = [r for r in rows if r.op == DLRM_STEP_OP]
        choices = judged_choice(model, steps, result)
        calibrations.append(
            {"rows": str(rows_path), "result": str(result_path), "task_seed": result["task_seed"], "choices": choices}
        )
        print(f"{rows_path.name} / {result_path.name} (seed {result['task_seed']}):")
        for choice, c in choices.items():
            s, t = c["steps_left_out"], c["tasks"]
            print(
                f"  {choice:10s} on {c['fitted_steps']:2d} steps: job space's steps left out {s['geomean_error']:.1%} "
                f"(mean signed {s['mean_signed_error']:+.1%}, n={s['n']}); run's tasks {t['geomean_error']:.1%}, "
                f"max {t['max_error']:.1%}, mean signed {t['mean_signed_error']:+.1%}",
                flush=True,
            )
    summary = pooled(calibrations)
    for choice in CHOICES:
        print(
            f"all runs' tasks, {choice}: geomean {summary[choice]['geomean_error']:.1%}, "
            f"mean signed {summary[choice]['mean_signed_error']:+.1%}"
        )
    print(f"runs leaning less on the job space: {summary['runs_leaning_less_on_job_space']} of {len(calibrations)}")
    command = "benchmarks/step_fit_space.py " + " ".join(map(str, args.pairs))
    print(f"wrote {write_result(args.out, {'command': command, 'calibrations': calibrations, 'pooled': summary})}")


if __name__ == "__main__":
    main()

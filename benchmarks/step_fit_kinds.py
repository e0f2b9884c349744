"""The DLRM step overhead fitted on every kind of calibration step with the features it had
until 12-03, against fitted on the task-shaped steps alone with today's, side by side on stored
#26 cycles (the calibration's rows and the DLRM run measured against it).

    .venv/bin/python benchmarks/step_fit_kinds.py [ROWS ...] [--last N] [--models DIR] [--out F]

Each cycle's bundle below the steps is taken from `--models` or fitted once
(`overhead_feature_refit.load_cycle`), then its step stage twice on those same kernel models:
"every step" (`fit_step_stage(every_dlrm_step=True)` on `FORMER_FEATURES`) and "task steps"
(the calibration's fit now, `step_fit.task_shaped_steps`). Both price the cycle's measured
DLRM tasks: the jobs' times are one spell's and only the step overhead differs, so the pair is
a paired comparison. Per cycle and fit: the run's geomean, worst and mean signed error, #26's
bars, each batch size's mean signed error less the run's own mean (the lean a spell cannot
make), and the calibration's task steps each left out in turn (fitted on the fit's other
steps). Over the cycles: each figure's mean paired change with its 95% interval.
(`step_fit_space.py` tried leaving out only the framework steps on 11-28, fitting every
kernel anew; this one starts from stored bundles.)

Writes benchmarks/results/step_fit_kinds.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import geomean, signed_errors, tasks_by_batch, write_result  # noqa: E402
from benchmarks.issue26_tally import run_meets_bars  # noqa: E402
from benchmarks.overhead_feature_refit import (  # noqa: E402
    add_cycle_arguments,
    change_text,
    chosen_cycles,
    each_cycle,
    load_cycle,
    refit_run,
    shown_path,
)
from benchmarks.refit_e2e import run_summary  # noqa: E402
from predictors.dlrm_estimator import OVERHEAD_FEATURES, step_residuals  # noqa: E402
from predictors.evaluation import leave_one_out_signed, mean_change  # noqa: E402
from predictors.kernel_classes import KERNEL_CLASSES  # noqa: E402
from predictors.opmodels import LinearCostModel, step_overhead_fitter  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import task_shaped_steps  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP, task_job  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

# The DLRM overhead's features until 12-03, when it was fitted on every kind of step.
FORMER_FEATURES = ["one", "dense_layers", "tables_total", "split_pieces", "pooled_elems", *KERNEL_CLASSES]
FITS = ("every step", "task steps")
PAIRED = ("geomean_error", "max_error", "abs_signed_error", "task_steps_left_out")


def dlrm_overhead(model: PerformanceModel) -> LinearCostModel:
    """The bundle's DLRM step overhead (a linear model on its features)."""
    overhead = model.step_overheads["dlrm"]
    assert isinstance(overhead, LinearCostModel)
    return overhead


def task_steps_left_out(model: PerformanceModel, fitted: list[Measurement]) -> np.ndarray:
    """Each task-shaped step's signed error under `model`'s kernels plus an overhead fitted (on
    `model`'s features) on the `fitted` steps other than it (`evaluation.leave_one_out_signed`
    over the `fitted` steps, as the calibration judges them)."""
    kernels, residuals = step_residuals(model, fitted)
    fit = step_overhead_fitter(DLRM_OVERHEAD_OP, dlrm_overhead(model).features, len(fitted))
    signed = leave_one_out_signed(residuals, kernels, [r.median_s for r in fitted], fit)
    return np.asarray([e for e, r in zip(signed, fitted) if task_job(r.params["job"])])


def judge_fit(below: PerformanceModel, rows: list[Measurement], result: dict, every_step: bool) -> dict:
    """One fit of the cycle's step stage and what it makes of the run and the task steps."""
    features = {"dlrm": FORMER_FEATURES} if every_step else {}
    model, tasks = refit_run(below, rows, result, features, every_dlrm_step=every_step)
    summary = run_summary(tasks)
    steps = [r for r in rows if r.op == DLRM_STEP_OP]
    fitted = steps if every_step else task_shaped_steps(steps, OVERHEAD_FEATURES)
    signed = signed_errors(tasks)
    left_out = task_steps_left_out(model, fitted)
    task_batches = np.asarray([r.params["job"]["batch_size"] for r in fitted if task_job(r.params["job"])])
    return {
        **{k: summary[k] for k in ("geomean_error", "max_error", "mean_signed_error", "tasks")},
        "abs_signed_error": abs(summary["mean_signed_error"]),
        "met": run_meets_bars(summary),
        "relative_by_batch": {
            str(b): float(signed_errors(group).mean() - signed.mean()) for b, group in tasks_by_batch(tasks).items()
        },
        "task_steps_left_out": geomean(list(np.abs(left_out))),
        "task_steps_signed_by_batch": {
            str(b): float(left_out[task_batches == b].mean()) for b in sorted(set(task_batches))
        },
        "steps_fitted": len(fitted),
        "coefficients": dict(zip(dlrm_overhead(model).features, map(float, dlrm_overhead(model).coef))),
    }


def judge_cycle(rows_path: Path, models: Path | None) -> dict:
    rows, result, below = load_cycle(rows_path, models)
    return {"rows": shown_path(rows_path), **{fit: judge_fit(below, rows, result, fit == FITS[0]) for fit in FITS}}


def paired_change(values: list[float]) -> dict | None:
    """The mean of task steps' less every step's figure over the cycles, with its interval."""
    return mean_change([v for v in values if v == v])  # a run without a batch size has none there


def summarise(cycles: list[dict]) -> dict:
    out = {key: paired_change([c[FITS[1]][key] - c[FITS[0]][key] for c in cycles]) for key in PAIRED}
    batches = sorted({b for c in cycles for fit in FITS for b in c[fit]["relative_by_batch"]}, key=int)
    for b in batches:
        out[f"relative_at_batch_{b}"] = paired_change(
            [
                c[FITS[1]]["relative_by_batch"].get(b, np.nan) - c[FITS[0]]["relative_by_batch"].get(b, np.nan)
                for c in cycles
            ]
        )
    return out


def print_fit(fit: str, f: dict) -> None:
    batches = " ".join(f"{b}: {x:+.1%}" for b, x in f["relative_by_batch"].items())
    print(
        f"  {fit:10s} geomean {f['geomean_error']:5.1%} max {f['max_error']:5.1%} signed {f['mean_signed_error']:+6.1%} "
        f"bars {'met' if f['met'] else 'missed'}; by batch less the run's mean {batches}; "
        f"task steps left out {f['task_steps_left_out']:.1%} (fitted on {f['steps_fitted']})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser)
    args = parser.parse_args()
    cycles = []
    for cycle in each_cycle(chosen_cycles(args), lambda path: judge_cycle(path, args.models)):
        cycles.append(cycle)
        for fit in FITS:
            print_fit(fit, cycle[fit])
    summary = summarise(cycles)
    for key, row in summary.items():
        if row is None:  # a batch no cycle's both fits had
            continue
        print(f"{key}: task steps - every step {change_text(row)} over {row['cycles']} cycles")
    met = {fit: sum(c[fit]["met"] for c in cycles) for fit in FITS}
    print(f"bars met: {met[FITS[1]]} of {len(cycles)} on task steps, {met[FITS[0]]} on every step")
    named = " ".join(map(str, args.rows)) if args.rows else f"--last {args.last}"
    out = args.out or str(REPO / "benchmarks/results/step_fit_kinds.json")
    result = {
        "command": f"python benchmarks/step_fit_kinds.py {named}",
        "cycles": cycles,
        "paired": summary,
        "met": met,
    }
    print(f"wrote {write_result(out, result)}")


if __name__ == "__main__":
    main()

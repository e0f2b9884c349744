"""The whole-step models refitted with the log error's squares (the fit as it stands) and with
soft-L1 (robust to a step timed in a slow spell), side by side, on every stored cycle's rows
and the jobs its end-to-end runs measured.

    .venv/bin/python benchmarks/robust_steps.py ROWS [ROWS ...] [--bundle-cache DIR] [--out FILE]

ROWS: a cycle's stored `measurements_<stamp>.jsonl.gz` under `benchmarks/results/e2e_issue26_<day>/`;
its runs are the `dlrm_<stamp>.json` and `transformer_<stamp>.json` beside it. Per cycle the
bundle is fitted once (`predictors.fit.fit_bundle`; `--bundle-cache` keeps it as JSON, a model
is data) and its step stage (`step_fit.fit_steps`: the collectives' in-step factors and each
workload's step overhead) refitted with each loss (`LinearCostModel.LOG_LOSS`), so the two fits
differ in nothing else. Each is judged by its own steps left out in turn (for the DLRM also the
mean signed error of its table-wise task steps, the calibration's steps most like a run's tasks,
in all and by batch size: how far the fit leans on them) and by the stored runs' tasks
re-predicted (`refit_e2e`): their geomean, worst task, mean signed error (in all and by batch
size), and whether they meet #26's bars (`issue26_tally.run_meets_bars`). A run's jobs are one
spell's: what differs between the columns is the prediction alone; what differs between a
run's lean and its task steps' is the run's. Writes benchmarks/results/robust_steps.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import signed_errors, tasks_by_batch, write_result  # noqa: E402
from benchmarks.issue26_tally import run_meets_bars  # noqa: E402
from benchmarks.refit_e2e import dlrm_predictions, read_rows, run_summary, transformer_predictions  # noqa: E402
from predictors.dlrm_estimator import step_residuals  # noqa: E402
from predictors.evaluation import leave_one_out_signed  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.opmodels import LinearCostModel, step_overhead_fitter  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import fit_steps  # noqa: E402
from probes.training import table_wise_task  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP, IN_STEP_COLLECTIVE_OP, TRANSFORMER_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

OUT = REPO / "benchmarks/results/robust_steps.json"
LOSSES = ("linear", "soft_l1")  # the fit as it stands, then the alternative
WORKLOADS = ("dlrm", "transformer")


@contextlib.contextmanager
def log_loss(loss: str) -> Iterator[None]:
    before = LinearCostModel.LOG_LOSS
    LinearCostModel.LOG_LOSS = loss
    try:
        yield
    finally:
        LinearCostModel.LOG_LOSS = before


def stamp_of(rows_path: Path) -> str:
    return rows_path.name.removeprefix("measurements_").split(".")[0]


def cycle_runs(rows_path: Path) -> dict[str, dict]:
    """The cycle's stored end-to-end runs by workload (a workload not run is absent)."""
    runs = {}
    for workload in WORKLOADS:
        path = rows_path.parent / f"{workload}_{stamp_of(rows_path)}.json"
        if path.is_file():
            runs[workload] = json.loads(path.read_text())
    return runs


def fitted_bundle(rows_path: Path, rows: list[Measurement], cache: Path | None) -> PerformanceModel:
    """The cycle's bundle, from `cache` where it was fitted before (the kernels' fits take
    minutes; the step stage is refitted on it anyway)."""
    cached = cache / f"{rows_path.parent.name}_{stamp_of(rows_path)}.json" if cache else None
    if cached is not None and cached.is_file():
        return PerformanceModel.from_dict(json.loads(cached.read_text()))
    model, _ = fit_bundle(rows, "refit", seed=0)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(model.to_dict()))
    return model


def refit_steps(model: PerformanceModel, rows: list[Measurement]) -> PerformanceModel:
    """A copy of `model` with its step stage fitted anew (under the `log_loss` in force), as
    `fit_bundle` fits it (its workloads' own collective factors dropped first: the stage
    decides them again)."""
    model = PerformanceModel.from_dict(model.to_dict())
    if model.in_step is not None:
        for workload in list(model.in_step.by_workload):
            model.in_step.drop_workload(workload)
    model.metrics.pop(IN_STEP_COLLECTIVE_OP, None)
    fit_steps(
        model, [r for r in rows if r.op == DLRM_STEP_OP], [r for r in rows if r.op == TRANSFORMER_STEP_OP], seed=0
    )
    return model


def task_steps_signed(model: PerformanceModel, rows: list[Measurement]) -> dict[str, Any] | None:
    """The signed errors of the calibration's table-wise task steps, each left out in turn
    (`evaluation.leave_one_out_signed`, the step overhead's own judge), their mean and mean by
    batch size: the fit's lean on the steps most like a run's tasks."""
    steps = [r for r in rows if r.op == DLRM_STEP_OP]
    if not steps:
        return None
    kernels, residuals = step_residuals(model, steps)
    fit = step_overhead_fitter(DLRM_OVERHEAD_OP, model.step_overheads["dlrm"].features, len(residuals))
    signed = leave_one_out_signed(residuals, kernels, [r.median_s for r in steps], fit)
    tasks = [(int(r.params["job"]["batch_size"]), float(e)) for r, e in zip(steps, signed) if table_wise_task(r)]
    if not tasks:
        return None
    by_batch: dict[int, list[float]] = {}
    for batch, error in tasks:
        by_batch.setdefault(batch, []).append(error)
    return {
        "mean": float(np.mean([e for _, e in tasks])),
        "by_batch": {b: float(np.mean(v)) for b, v in sorted(by_batch.items())},
        "n": len(tasks),
    }


def judged(model: PerformanceModel, rows: list[Measurement], runs: dict[str, dict]) -> dict[str, Any]:
    """The refitted model's steps left out in turn and its stored runs' tasks re-predicted."""
    out: dict[str, Any] = {}
    for workload, op in (("dlrm", DLRM_STEP_OP), ("transformer", TRANSFORMER_STEP_OP)):
        stats = model.metrics.get(op)
        figures: dict[str, Any] = {"steps_left_out": stats["gmae"] if stats else None}
        if workload == "dlrm" and stats:
            figures["task_steps_signed"] = task_steps_signed(model, rows)
        run = runs.get(workload)
        if run is not None:
            tasks = dlrm_predictions(model, run) if workload == "dlrm" else transformer_predictions(model, run["tasks"])
            summary = run_summary(tasks)
            by_batch = {b: float(signed_errors(mine).mean()) for b, mine in tasks_by_batch(tasks).items()}
            figures.update(
                geomean=summary["geomean_error"],
                max=summary["max_error"],
                signed=summary["mean_signed_error"],
                met=run_meets_bars(summary),
                signed_by_batch=by_batch,
            )
        out[workload] = figures
    return out


def cell(figures: dict[str, Any]) -> str:
    steps = f"steps {figures['steps_left_out']:.1%}"
    if figures.get("task_steps_signed") is not None:
        steps += f", task steps {figures['task_steps_signed']['mean']:+.1%}"
    if "geomean" not in figures:
        return f"not run; {steps}"
    return (
        f"{figures['geomean']:5.1%} {figures['max']:5.1%} {figures['signed']:+6.1%} "
        f"{'met' if figures['met'] else 'MISSED':6s} {steps}"
    )


def tally(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    """Per loss and workload: cycles meeting the bars, and the spread of their figures over cycles."""
    out: dict[str, Any] = {}
    for loss in LOSSES:
        for workload in WORKLOADS:
            runs = [c[loss][workload] for c in cycles if "geomean" in c[loss][workload]]
            if not runs:
                continue
            signed = np.array([r["signed"] for r in runs])
            out[f"{loss}/{workload}"] = {
                "runs": len(runs),
                "met": sum(r["met"] for r in runs),
                "geomean_median": float(np.median([r["geomean"] for r in runs])),
                "signed_mean": float(signed.mean()),
                "signed_sd": float(signed.std(ddof=1)) if len(runs) > 1 else None,
                "abs_signed_mean": float(np.abs(signed).mean()),
                "steps_left_out_median": float(np.median([r["steps_left_out"] for r in runs])),
            }
            leans = [r["task_steps_signed"] for r in runs if r.get("task_steps_signed") is not None]
            if leans:
                figures = out[f"{loss}/{workload}"]
                figures["task_steps_signed_mean"] = float(np.mean([lean["mean"] for lean in leans]))
                batches = sorted({b for lean in leans for b in lean["by_batch"]})
                figures["task_steps_signed_by_batch"] = {
                    b: float(np.mean([lean["by_batch"][b] for lean in leans if b in lean["by_batch"]])) for b in batches
                }
                figures["run_signed_by_batch"] = {
                    b: float(np.mean([r["signed_by_batch"][b] for r in runs if b in r.get("signed_by_batch", {})]))
                    for b in batches
                }
        both = [c[loss] for c in cycles if all("geomean" in c[loss][w] for w in WORKLOADS)]
        out[f"{loss}/both"] = {"runs": len(both), "met": sum(all(c[w]["met"] for w in WORKLOADS) for c in both)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", type=Path, nargs="+", help="cycles' stored measurements_<stamp>.jsonl.gz")
    parser.add_argument("--bundle-cache", type=Path, help="keep each cycle's fitted bundle here (JSON)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    missing = [str(p) for p in args.rows if not p.is_file()]
    if missing:
        parser.error(f"ROWS: no such file: {', '.join(missing)}")
    cycles = []
    print(f"{'cycle':28s} {'loss':8s} {'DLRM geomean max signed':44s} | transformer DP")
    for rows_path in args.rows:
        rows = read_rows(rows_path)
        runs = cycle_runs(rows_path)
        model = fitted_bundle(rows_path, rows, args.bundle_cache)
        cycle: dict[str, Any] = {
            "rows": str(rows_path.relative_to(REPO) if rows_path.is_relative_to(REPO) else rows_path)
        }
        for loss in LOSSES:
            with log_loss(loss):  # the refit and its left-out task steps alike
                cycle[loss] = judged(refit_steps(model, rows), rows, runs)
            name = f"{rows_path.parent.name.removeprefix('e2e_issue26_')} {stamp_of(rows_path)}"
            print(
                f"{name:28s} {loss:8s} {cell(cycle[loss]['dlrm']):44s} | {cell(cycle[loss]['transformer'])}", flush=True
            )
        cycles.append(cycle)
    summary = tally(cycles)
    for key, figures in summary.items():
        print(
            f"{key:22s} "
            + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        )
    command = "benchmarks/robust_steps.py " + " ".join(c["rows"] for c in cycles)
    print(
        f"wrote {write_result(args.out, {'command': command, 'losses': list(LOSSES), 'summary': summary, 'cycles': cycles})}"
    )


if __name__ == "__main__":
    main()

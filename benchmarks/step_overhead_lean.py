"""Which way a calibration's step overhead leans on the steps it did not see: each DLRM step
left out in turn, predicted by its kernels plus an overhead fitted on the others, for both
objectives (relative to each measured step, and the log of the whole step).

    .venv/bin/python benchmarks/step_overhead_lean.py ROWS [ROWS ...] [--out PATH]

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`). Prints per calibration and
objective the mean and median signed error and the GMAE over its steps, and the signed errors
of its task-shaped table-wise steps; writes them to benchmarks/results/step_overhead_lean.json. Issue #26 chose the log fit as the default from this
(`predictors/opmodels.fit_step_overhead`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.dlrm_estimator import OVERHEAD_FEATURES, step_residuals  # noqa: E402
from predictors.evaluation import leave_one_out_signed  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.opmodels import fit_linear_or_constant, step_kernels  # noqa: E402
from probes.training import table_wise_task  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP  # noqa: E402


def left_out_errors(path: Path) -> dict[str, list[tuple[str, float, bool]]]:
    """Per objective, each step's (job name, signed error left out, a table-wise task's)."""
    rows = read_rows(path)
    model, _ = fit_bundle(rows, "lean", seed=0)
    steps = [r for r in rows if r.op == DLRM_STEP_OP]
    kernels, residuals = step_residuals(model, steps)
    names = [row.params["job"]["name"] for row in steps]
    table_wise = [table_wise_task(row) for row in steps]
    fits = {
        "relative": lambda train: fit_linear_or_constant(DLRM_OVERHEAD_OP, OVERHEAD_FEATURES, train),
        "log": lambda train: fit_linear_or_constant(DLRM_OVERHEAD_OP, OVERHEAD_FEATURES, train, step_kernels(train)),
    }
    measured = [row.median_s for row in steps]
    return {
        objective: list(zip(names, leave_one_out_signed(residuals, kernels, measured, fit).tolist(), table_wise))
        for objective, fit in fits.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="+", type=Path)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/step_overhead_lean.json"))
    args = parser.parse_args()
    result = {}
    for path in args.rows:
        result[path.name] = {}
        for objective, errors in left_out_errors(path).items():
            e = np.asarray([x[1] for x in errors])
            tasks = [x[1] for x in errors if x[2]]
            summary = {
                "signed_mean": float(e.mean()),
                "signed_median": float(np.median(e)),
                "gmae": float(np.exp(np.mean(np.log(np.abs(e) + 1e-9)))),
                "n": len(e),
                "table_wise_tasks_signed": tasks,
            }
            result[path.name][objective] = summary
            print(
                f"{path}: {objective:8s} signed mean {summary['signed_mean']:+.1%}, median "
                f"{summary['signed_median']:+.1%}, GMAE {summary['gmae']:.1%} (n={len(e)}); table-wise tasks "
                + ", ".join(f"{x:+.1%}" for x in tasks),
                flush=True,
            )
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

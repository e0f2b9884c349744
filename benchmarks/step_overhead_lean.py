"""Which way a calibration's step overhead leans on the steps it did not see: each DLRM step
left out in turn, predicted by its kernels plus an overhead fitted on the others, for both
objectives (relative to each measured step, and the log of the whole step).

    .venv/bin/python benchmarks/step_overhead_lean.py ROWS [ROWS ...]

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`). Prints per calibration and
objective the mean and median signed error and the GMAE over its steps, and the signed errors
of its task-shaped table-wise steps. Issue #26 chose the log fit as the default from this
(`predictors/opmodels.fit_step_overhead`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.dlrm_estimator import OVERHEAD_FEATURES, _predicted_step_s, _residual  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.opmodels import fit_linear_or_constant, step_kernels  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP  # noqa: E402


def left_out_errors(path: Path) -> dict[str, list[tuple[str, float, bool]]]:
    """Per objective, each step's (job name, signed error left out, mixed plan)."""
    rows = read_rows(path)
    model, _ = fit_bundle(rows, "lean", seed=0)
    steps = [r for r in rows if r.op == DLRM_STEP_OP]
    kernels = [_predicted_step_s(model, r, include_overhead=False, simulate_graph=True) for r in steps]
    residuals = [_residual(r, k) for r, k in zip(steps, kernels)]
    out: dict[str, list[tuple[str, float, bool]]] = {}
    for objective in ("relative", "log"):
        errors = []
        for i, row in enumerate(steps):
            others = [x for j, x in enumerate(residuals) if j != i]
            offset = step_kernels(others) if objective == "log" else None
            fit = fit_linear_or_constant(DLRM_OVERHEAD_OP, OVERHEAD_FEATURES, others, offset)
            predicted = kernels[i] + fit.predict(residuals[i].params)
            mixed = any(isinstance(p, dict) for p in row.params["table_to_rank"])
            errors.append((row.params["job"]["name"], (predicted - row.median_s) / row.median_s, mixed))
        out[objective] = errors
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.rows:
        for objective, errors in left_out_errors(path).items():
            e = np.asarray([x[1] for x in errors])
            tasks = [f"{x[1]:+.1%}" for x in errors if x[0].startswith("task") and not x[2]]
            print(
                f"{path}: {objective:8s} signed mean {e.mean():+.1%}, median {np.median(e):+.1%}, "
                f"GMAE {np.exp(np.mean(np.log(np.abs(e) + 1e-9))):.1%} (n={len(e)}); table-wise tasks {', '.join(tasks)}",
                flush=True,
            )


if __name__ == "__main__":
    main()

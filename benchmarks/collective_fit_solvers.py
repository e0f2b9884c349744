"""Where a calibration's fit time goes, and whether a cheaper solver finds the same transitions.

    .venv/bin/python benchmarks/collective_fit_solvers.py [ROWS] [--ops OP,OP] [--out RESULT.json]

A calibration's fit is mostly the collective breakpoint search: each curve's nested search
fits a transition (`predictors.collective_model._fit_transition`, four bounded parameters by
`scipy.optimize.least_squares`) for every breakpoint pair and fold, ~1,700 times for a curve
of 45 sizes, and the calibration's k-fold judge repeats the whole search per fold. This fits
each collective op's curves of ROWS (default: #26's 12-07 18:59 cycle) as a calibration does,
records every transition problem the search posed, and solves each again by variable
projection (L and b, which enter linearly, solved in closed form inside a two-parameter
least-squares search over x0 and k, Kaufman's Jacobian), side by side in this process.

Printed and written per op: the problems, the seconds and residual evaluations each solver
took, and how often variable projection ended at a worse or better minimum than the current
solver: its root-mean-square residual (log10 bandwidth) higher or lower by more than
`DIFFERENT_RMS`, with the largest differences. A faster solver is only a candidate if it finds the
current solver's minima: the breakpoint choice compares sums of these fits' CV errors.
Writes benchmarks/results/collective_fit_solvers.json.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import predictors.collective_model as collective_model  # noqa: E402
from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.families import COLLECTIVES  # noqa: E402

DEFAULT_ROWS = REPO / "benchmarks/results/e2e_issue26_20261207/measurements_1859.jsonl.gz"
OUT = REPO / "benchmarks/results/collective_fit_solvers.json"
# Two solutions whose rms residuals differ by more than this (log10 bandwidth: 0.23%, a tenth of
# a collective's typical measurement noise) are different minima.
DIFFERENT_RMS = 1e-3


def rms(p: np.ndarray, xm: np.ndarray, ym: np.ndarray) -> float:
    """The root-mean-square residual of (L, x0, k, b) on the points (log10 bandwidth)."""
    L, x0, k, b = p
    return float(np.sqrt(np.mean((L * collective_model._logistic(xm, x0, k) + b - ym) ** 2)))


def linear_part(s: np.ndarray, ym: np.ndarray, lower: list[float], upper: list[float]) -> tuple[float, float]:
    """(L, b) minimising ||L s + b - ym|| for a fixed sigmoid shape s: the unbounded solution,
    L clipped into its bounds and b refitted for it, then clipped."""
    centred = s - s.mean()
    spread = float(np.dot(centred, centred))
    L = float(np.dot(centred, ym - ym.mean()) / spread) if spread > 1e-300 else 0.0
    L = min(max(L, lower[0]), upper[0])
    b = min(max(float(np.mean(ym - L * s)), lower[3]), upper[3])
    return L, b


def variable_projection(
    xm: np.ndarray, ym: np.ndarray, x1: float, x2: float, start: np.ndarray
) -> tuple[np.ndarray, int]:
    """(L, x0, k, b) by least squares over (x0, k) alone, (L, b) solved for each: the parameters
    and the solver's residual evaluations."""
    lower, upper = collective_model._transition_bounds(x1, x2)

    def resid(q: np.ndarray) -> np.ndarray:
        s = collective_model._logistic(xm, *q)
        L, b = linear_part(s, ym, lower, upper)
        return L * s + b - ym

    def jac(q: np.ndarray) -> np.ndarray:
        """Kaufman's: the derivative at fixed (L, b), projected off the span of what is solved for
        each q: [s, 1] while L is inside its bounds, [1] alone (b) while L sits on one."""
        x0, k = q
        s = collective_model._logistic(xm, x0, k)
        L, _ = linear_part(s, ym, lower, upper)
        slope = L * s * (1.0 - s)
        partial = np.column_stack([-k * slope, (xm - x0) * slope])
        free = lower[0] < L < upper[0]
        basis = np.column_stack([s, np.ones_like(s)]) if free else np.ones((len(s), 1))
        return partial - basis @ np.linalg.lstsq(basis, partial, rcond=None)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = least_squares(resid, start[1:3], jac=jac, bounds=(lower[1:3], upper[1:3]))
    L, b = linear_part(collective_model._logistic(xm, *fit.x), ym, lower, upper)
    return np.array([L, fit.x[0], fit.x[1], b]), fit.nfev


def recorded_problems(rows: list) -> tuple[list[tuple], float, dict]:
    """Fit `rows`' curves (one collective op) as a calibration does, recording every transition
    problem the search posed with the current solver's answer and seconds; the fit's seconds and
    its curves by group."""
    problems: list[tuple] = []
    current = collective_model._fit_transition

    def recording(xm, ym, x1, x2, start):
        t0 = time.perf_counter()
        p = current(xm, ym, x1, x2, start)
        problems.append((xm, ym, x1, x2, start, p, time.perf_counter() - t0))
        return p

    model = collective_model.SigmoidCollectiveModel(rows[0].op)
    collective_model._fit_transition = recording
    try:
        t0 = time.perf_counter()
        model.fit(rows)
        seconds = time.perf_counter() - t0
    finally:
        collective_model._fit_transition = current
    return problems, seconds, model.curves


def compare(op: str, rows: list) -> dict:
    problems, fit_s, _ = recorded_problems(rows)
    current_s = sum(p[-1] for p in problems)
    projected_s, evaluations, gaps, on_bound = 0.0, [], [], 0
    for xm, ym, x1, x2, start, p, _ in problems:
        t0 = time.perf_counter()
        q, nfev = variable_projection(xm, ym, x1, x2, start)
        projected_s += time.perf_counter() - t0
        evaluations.append(nfev)
        gap = rms(q, xm, ym) - rms(p, xm, ym)
        gaps.append(gap)
        lower, upper = collective_model._transition_bounds(x1, x2)
        on_bound += gap > DIFFERENT_RMS and not lower[0] < q[0] < upper[0]
    worse = [g for g in gaps if g > DIFFERENT_RMS]
    return {
        "op": op,
        "points": len(rows),
        "curve_fit_s": fit_s,
        "problems": len(problems),
        "current_s": current_s,
        "current_share_of_fit": current_s / fit_s if fit_s else None,
        "projection_s": projected_s,
        "projection_over_current": projected_s / current_s if current_s else None,
        "projection_mean_evaluations": float(np.mean(evaluations)) if evaluations else None,
        "projection_worse": len(worse),
        "projection_worse_share": len(worse) / len(problems) if problems else None,
        "projection_worse_with_L_on_a_bound": int(on_bound),
        "projection_worst_rms_gap": max(gaps) if gaps else None,
        "projection_better": sum(g < -DIFFERENT_RMS for g in gaps),
        "projection_best_rms_gap": min(gaps) if gaps else None,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="?", type=Path, default=DEFAULT_ROWS)
    parser.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {sorted(COLLECTIVES)}")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - set(COLLECTIVES))
    if unknown:
        parser.error(f"--ops: {unknown} are not collectives; allowed: {sorted(COLLECTIVES)}")
    rows = read_rows(args.rows)
    results = []
    for op in ops:
        mine = [r for r in rows if r.op == op]
        if not mine:
            parser.error(f"--ops: {args.rows} has no {op} rows")
        result = compare(op, mine)
        results.append(result)
        print(
            f"{op}: {result['points']} points, curve fit {result['curve_fit_s']:.1f} s, {result['problems']} "
            f"transition fits = {result['current_s']:.1f} s ({result['current_share_of_fit']:.0%}); variable "
            f"projection {result['projection_s']:.1f} s ({result['projection_over_current']:.2f}x), "
            f"{result['projection_mean_evaluations']:.1f} evaluations each; worse minimum in "
            f"{result['projection_worse']} ({result['projection_worse_share']:.1%}; "
            f"{result['projection_worse_with_L_on_a_bound']} with L on a bound; rms up to "
            f"{result['projection_worst_rms_gap']:+.3f}), better in {result['projection_better']} (rms down to "
            f"{result['projection_best_rms_gap']:+.3f})"
        )
    out = {
        "command": "python benchmarks/collective_fit_solvers.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": str(args.rows.relative_to(REPO)) if args.rows.is_relative_to(REPO) else str(args.rows),
        "different_rms": DIFFERENT_RMS,
        "ops": results,
    }
    print(f"wrote {write_result(args.out, out)}")
    return out


if __name__ == "__main__":
    main()

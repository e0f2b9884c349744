"""How far a stored #26 run's DLRM prediction moves with which calibration steps were drawn.

    .venv/bin/python benchmarks/step_sample_spread.py [ROWS ...] [--last N] [--draws K] [--models DIR]

ROWS: a stored cycle's `measurements_HHMM.jsonl.gz`, its `dlrm_HHMM.json` beside it (default:
the last `--last` cycles under `benchmarks/results/e2e_issue26_*/` that have both). Each
cycle's bundle below the steps is fitted once (`overhead_feature_refit.below_steps`, kept in
`--models DIR`), then its step stage (`fit.fit_step_stage`) on every DLRM step measured and on
`--draws` draws that each leave out a quarter of the steps that fit keeps (since 12-03 the
task-shaped ones, `step_fit.task_shaped_steps`; results before 12-03, such as the committed
nine-cycle `step_sample_spread.json` of 11-29, fitted and drew over every step; those of 12-03
drew a quarter of every step, so a varying count of task steps); each fit predicts the
cycle's measured tasks.
The draws' spread, scaled as a delete-d jackknife (variance x kept / left out), estimates the
standard deviation of the run's mean signed error, geomean and worst error that comes from the
calibration having measured these steps and not others: the part of a run's miss that more
steps would shrink (as one over the square root of their count), beside the spread of the
signed error across the cycles, which also holds the host's spells and the model's lean.

Writes benchmarks/results/step_sample_spread.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.overhead_feature_refit import (  # noqa: E402
    add_cycle_arguments,
    chosen_cycles,
    each_cycle,
    load_cycle,
    refit_run,
    shown_path,
)
from benchmarks.refit_e2e import run_summary  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import OVERHEAD_FEATURES, task_shaped_steps  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

FIGURES = ("mean_signed_error", "geomean_error", "max_error")
LEFT_OUT_SHARE = 0.25  # of the DLRM steps, left out by each draw


def left_out_draws(steps: int, draws: int, seed: int = 0) -> list[list[int]]:
    """`draws` sets of a quarter of `steps` step indices (at least one), each drawn without
    replacement from one seeded stream."""
    rng = np.random.default_rng(seed)
    count = max(1, int(round(steps * LEFT_OUT_SHARE)))
    return [sorted(int(i) for i in rng.choice(steps, size=count, replace=False)) for _ in range(draws)]


def jackknife_sd(values: np.ndarray, steps: int, left_out: int) -> float:
    """The delete-d jackknife's standard deviation of a figure fitted on all `steps`, from its
    values on draws that each left `left_out` of them out: sqrt(kept / left_out x variance)."""
    return float(np.sqrt((steps - left_out) / left_out * np.var(values)))


def fitted_step_indices(rows: list[Measurement]) -> list[int]:
    """Where in `rows` the DLRM steps lie that the step fit keeps (`step_fit.task_shaped_steps`:
    the task-shaped ones, or every step when too few are), so that a draw leaves out a quarter
    of the steps the fit rests on, not a varying share of them."""
    steps = [r for r in rows if r.op == DLRM_STEP_OP]
    kept = {id(r) for r in task_shaped_steps(steps, OVERHEAD_FEATURES["dlrm"])}
    return [i for i, r in enumerate(rows) if id(r) in kept]


def run_figures(below: PerformanceModel, rows: list[Measurement], result: dict) -> dict[str, float]:
    """The stored run's figures under the step stage fitted on `rows` over `below`."""
    _, tasks = refit_run(below, rows, result)
    summary = run_summary(tasks)
    return {key: float(summary[key]) for key in FIGURES}


def spread_of_cycle(rows_path: Path, draws: int, models: Path | None) -> dict:
    """One cycle's run under the fit on every DLRM step measured and under each draw's."""
    rows, result, below = load_cycle(rows_path, models)
    step_at = fitted_step_indices(rows)
    if len(step_at) < 2:
        raise SystemExit(f"{rows_path.name}: {len(step_at)} fitted DLRM step(s); a spread over draws takes 2 or more")
    full = run_figures(below, rows, result)
    draws_out = left_out_draws(len(step_at), draws)
    drawn = []
    for out in draws_out:
        dropped = {step_at[i] for i in out}
        drawn.append(run_figures(below, [r for i, r in enumerate(rows) if i not in dropped], result))
    left_out = len(draws_out[0])
    return {
        "rows": shown_path(rows_path),
        "steps": len(step_at),
        "left_out": left_out,
        "all_steps": full,
        "draws": drawn,
        "jackknife_sd": {
            key: jackknife_sd(np.array([d[key] for d in drawn]), len(step_at), left_out) for key in FIGURES
        },
    }


def summary_of(cycles: list[dict]) -> dict:
    """Over the cycles: the mean jackknife sd of each figure, and the spread of the runs' signed
    error (all steps) across cycles, which the step sample is one part of."""
    signed = np.array([c["all_steps"]["mean_signed_error"] for c in cycles])
    return {
        "cycles": len(cycles),
        "mean_jackknife_sd": {key: float(np.mean([c["jackknife_sd"][key] for c in cycles])) for key in FIGURES},
        "signed_across_cycles": {
            "mean": float(signed.mean()),
            "sd": float(signed.std(ddof=1)) if len(signed) > 1 else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser)
    parser.add_argument("--draws", type=int, default=16, help="draws a cycle, each leaving a quarter out")
    args = parser.parse_args()
    if args.draws < 2:
        parser.error(f"--draws: {args.draws}; a spread takes 2 or more")
    paths = chosen_cycles(args)
    cycles = []
    for cycle in each_cycle(paths, lambda path: spread_of_cycle(path, args.draws, args.models)):
        cycles.append(cycle)
        full, sd = cycle["all_steps"], cycle["jackknife_sd"]
        signed = [d["mean_signed_error"] for d in cycle["draws"]]
        print(
            f"  {cycle['steps']} steps: signed {full['mean_signed_error']:+.1%} (sd {sd['mean_signed_error']:.1%}, "
            f"draws {min(signed):+.1%}..{max(signed):+.1%}), geomean {full['geomean_error']:.1%} "
            f"(sd {sd['geomean_error']:.1%}), max {full['max_error']:.1%} (sd {sd['max_error']:.1%})",
            flush=True,
        )
    summary = summary_of(cycles)
    sd, across = summary["mean_jackknife_sd"], summary["signed_across_cycles"]
    spread = "" if across["sd"] is None else f", sd {across['sd']:.1%}"
    print(
        f"over {len(cycles)} cycles: the step sample's sd of the run's signed error {sd['mean_signed_error']:.1%}, "
        f"geomean {sd['geomean_error']:.1%}, max {sd['max_error']:.1%}; "
        f"the runs' signed error across cycles: mean {across['mean']:+.1%}{spread}"
    )
    named = " ".join(map(str, args.rows)) if args.rows else f"--last {args.last}"
    command = f"python benchmarks/step_sample_spread.py {named} --draws {args.draws}"
    out = args.out or str(REPO / "benchmarks/results/step_sample_spread.json")
    print(f"wrote {write_result(out, {'command': command, 'summary': summary, 'cycles': cycles})}")


if __name__ == "__main__":
    main()

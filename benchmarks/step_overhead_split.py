"""How much a step overhead fitted on a fifth fewer steps moves a run's predictions.

    .venv/bin/python benchmarks/step_overhead_split.py ROWS RESULT [RESULT ...] [--draws 500] [--out PATH]

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`); RESULT: the JSON of
`benchmarks/e2e_accuracy.py` or `benchmarks/e2e_accuracy_transformer.py` run against it. Fits
the bundle this code fits (`predictors.fit.fit_bundle`), then refits each workload's step
overhead as `predictors.opmodels.fit_step_overhead` does (`step_overhead_fitter`) on every draw of 80% of its steps (all of
them up to `--draws`, else that many at random) and on all of them, and re-predicts the run's
measured tasks with each: the mean signed error and the geomean error of the tasks, their
range over the draws, and where the draw the calibration used to make (`split_by_op`, seed 0)
falls. Issue #26 judged from this that a calibration's 7-20 steps are too few to set a fifth
aside (the step overhead is now fitted on all of them and judged each left out in turn).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.e2e_accuracy import geomean, task_plan, write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors import dlrm_estimator, transformer_estimator  # noqa: E402
from predictors.evaluation import held_out_count, split_by_op  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.opmodels import step_overhead_fitter  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from probes.vocabulary.ops import DLRM_OVERHEAD_OP, DLRM_STEP_OP, TRANSFORMER_OVERHEAD_OP, TRANSFORMER_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402

Task = tuple[float, dict[str, Any], float]  # (simulated kernels s, overhead params, measured s)


def dlrm_tasks(model: PerformanceModel, result: dict) -> list[Task]:
    specs = random_dlrm_tasks(len(result["tasks"]), result["world_size"], result["task_seed"], result["scale"])
    out = []
    for i, (spec, row) in enumerate(zip(specs, result["tasks"])):
        _, plan = task_plan(i, spec, result["task_seed"])
        kernels = dlrm_estimator.estimate_iteration(spec, plan, model, include_overhead=False)
        out.append((kernels.iteration_s, kernels.overhead_params, row["measured_ms"] / 1e3))
    return out


def transformer_tasks(model: PerformanceModel, rows: list[dict]) -> list[Task]:
    out = []
    for row in rows:
        estimate = transformer_estimator.estimate_transformer_iteration(
            TransformerSpec.from_dict(row["spec"]), model, include_overhead=False
        )
        out.append((estimate.iteration_s, estimate.overhead_params, row["measured_ms"] / 1e3))
    return out


def signed_errors(fit: Any, tasks: Sequence[Task]) -> np.ndarray:
    return np.array([(k + fit.predict(p) - m) / m for k, p, m in tasks])


def spread_over_draws(
    fit: Callable[[list[int]], Any], steps: Sequence[Measurement], tasks: Sequence[Task], draws: int, seed: int
) -> dict[str, Any]:
    """The tasks' mean signed and geomean errors with the overhead fitted on all steps, on the
    calibration's old seeded 80% draw, and over every (or `draws` random) 80% draws."""
    n = len(steps)
    held = held_out_count(n)
    combos = list(itertools.combinations(range(n), held))
    if len(combos) > draws:
        rng = np.random.default_rng(seed)
        combos = [tuple(rng.choice(n, size=held, replace=False)) for _ in range(draws)]
    train, _ = split_by_op(steps, seed)
    kept = {id(r) for r in train}
    seeded = [i for i, r in enumerate(steps) if id(r) in kept]

    def figures(errors: np.ndarray) -> dict[str, float]:
        return {"signed": float(errors.mean()), "geomean": geomean(list(np.abs(errors)))}

    over = [figures(signed_errors(fit([i for i in range(n) if i not in drop]), tasks)) for drop in combos]
    signed = np.array([f["signed"] for f in over])
    geo = np.array([f["geomean"] for f in over])
    return {
        "steps": n,
        "held_out_per_draw": held,
        "draws": len(combos),
        "all_steps": figures(signed_errors(fit(list(range(n))), tasks)),
        "seeded_draw": figures(signed_errors(fit(seeded), tasks)),
        "draws_signed": {
            "mean": float(signed.mean()),
            "sd": float(signed.std()),
            "min": float(signed.min()),
            "max": float(signed.max()),
        },
        "draws_geomean": {"mean": float(geo.mean()), "min": float(geo.min()), "max": float(geo.max())},
    }


def workload_fit(op: str, features: list[str], residuals: list[Measurement]) -> Callable[[list[int]], Any]:
    """The step overhead the calibration would fit on the steps at `index` (without the
    leave-one-out figures it would also compute: only the model is used here)."""

    def fit(index: list[int]) -> Any:
        return step_overhead_fitter(op, features, len(index))([residuals[i] for i in index])

    return fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--draws", type=int, default=500, help="at most this many 80%% draws (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="the calibration's seed (its old split)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    rows = read_rows(args.rows)
    model, _ = fit_bundle(rows, "split", seed=args.seed)
    by_op = {op: [r for r in rows if r.op == op] for op in (DLRM_STEP_OP, TRANSFORMER_STEP_OP)}
    out: dict[str, Any] = {
        "command": "benchmarks/step_overhead_split.py " + " ".join(map(str, [args.rows, *args.results]))
    }
    for path in args.results:
        result = json.loads(path.read_text())
        if "world_size" in result and "scale" in result:
            steps = by_op[DLRM_STEP_OP]
            _, residuals = dlrm_estimator.step_residuals(model, steps)
            fit = workload_fit(DLRM_OVERHEAD_OP, dlrm_estimator.OVERHEAD_FEATURES, residuals)
            cases = {"DLRM": dlrm_tasks(model, result)}
        else:
            steps = by_op[TRANSFORMER_STEP_OP]
            _, residuals = transformer_estimator.step_residuals(model, steps)
            fit = workload_fit(TRANSFORMER_OVERHEAD_OP, transformer_estimator.OVERHEAD_FEATURES, residuals)
            cases = {"transformer DP": transformer_tasks(model, result["tasks"])}
            if result.get("tensor_parallel_tasks"):
                cases["transformer TP"] = transformer_tasks(model, result["tensor_parallel_tasks"])
        for label, tasks in cases.items():
            figures = spread_over_draws(fit, steps, tasks, args.draws, args.seed)
            out[label] = figures
            d = figures["draws_signed"]
            print(
                f"{args.rows.name} {label}: {figures['steps']} steps; tasks' mean signed error, overhead on all "
                f"steps {figures['all_steps']['signed']:+.1%} (geomean {figures['all_steps']['geomean']:.1%}); on "
                f"the seeded 80% {figures['seeded_draw']['signed']:+.1%} ({figures['seeded_draw']['geomean']:.1%}); "
                f"over {figures['draws']} draws of 80% {d['mean']:+.1%} sd {d['sd']:.1%} [{d['min']:+.1%}, "
                f"{d['max']:+.1%}], geomean {figures['draws_geomean']['min']:.1%}-{figures['draws_geomean']['max']:.1%}",
                flush=True,
            )
    if args.out:
        print(f"wrote {write_result(args.out, out)}")


if __name__ == "__main__":
    main()

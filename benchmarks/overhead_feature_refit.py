"""A DLRM step-overhead feature judged on stored #26 cycles, with and without it, side by side.

    .venv/bin/python benchmarks/overhead_feature_refit.py FEATURE [ROWS ...] [--last N] [--models DIR] [--out F]

ROWS: a stored cycle's `measurements_HHMM.jsonl.gz`, its `dlrm_HHMM.json` beside it (default:
the last `--last` cycles under `benchmarks/results/e2e_issue26_*/` that have both). Each
cycle's bundle is fitted from its rows with this code once below the steps
(`predictors.fit.fit_below_steps`), then its step overhead twice on those same kernel models
(`fit_step_stage`): with FEATURE (the default features, plus FEATURE when it is a candidate,
`dlrm_estimator.CANDIDATE_FEATURES`) and without it. Both predict the
cycle's measured DLRM tasks (`refit_e2e.dlrm_predictions`): the jobs' times are one spell's
and only the overhead differs, so the pair is a paired comparison. Per cycle: the steps left
out in turn and the run's geomean, mean signed and worst error each way, whether #26's bars are
met, and each step's residual beside its kernel features (`step_table`); over the cycles, the
mean paired change in geomean and worst error with 95% intervals.
A feature that helps one cycle and not the others is noise, not a model. `--models DIR`: keep
each cycle's below-steps bundle there (plain JSON, `PerformanceModel.save`) and take it from
there next time: a fit is 15-30 minutes on 2 cores, a step stage seconds.

Writes benchmarks/results/overhead_feature_<FEATURE>.json.

    .venv/bin/python benchmarks/overhead_feature_refit.py pair BEFORE.json AFTER.json

pairs two such outputs written by two codes on the same cycles (`pair_outputs`): the default
fits' change in the DLRM runs' figures, nothing refitted.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.issue26_tally import run_meets_bars  # noqa: E402
from benchmarks.refit_e2e import dlrm_predictions, read_rows, run_summary  # noqa: E402
from predictors import dlrm_estimator  # noqa: E402
from predictors.dlrm_estimator import estimate_step  # noqa: E402
from predictors.evaluation import mean_change  # noqa: E402
from predictors.fit import fit_below_steps, fit_step_stage  # noqa: E402
from predictors.kernel_classes import KERNEL_CLASSES  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import OVERHEAD_FEATURES, OverheadFeatures  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

ROWS = re.compile(r"^measurements_(\d{4})\.jsonl\.gz$")


def stored_cycles(root: Path, last: int, workload: str = "dlrm") -> list[Path]:
    """The last `last` stored cycles' rows that have a `workload` run beside them, oldest first."""
    found = []
    for day in sorted(root.glob("e2e_issue26_2*")):
        for path in sorted(day.iterdir()):
            match = ROWS.match(path.name)
            if match and (day / f"{workload}_{match.group(1)}.json").exists():
                found.append(path)
    return found[-last:]


def add_cycle_arguments(parser: argparse.ArgumentParser, last: int = 4) -> None:
    """What every benchmark over stored cycles takes: ROWS, `--last`, `--models` and `--out`."""
    parser.add_argument("rows", nargs="*", type=Path)
    parser.add_argument("--last", type=int, default=last, help=f"cycles taken when no ROWS are named (default {last})")
    parser.add_argument("--models", type=Path, help="keep (and reuse) each cycle's below-steps bundle here")
    parser.add_argument("--out")


def chosen_cycles(args: argparse.Namespace, workload: str = "dlrm") -> list[Path]:
    """The cycles `add_cycle_arguments`' arguments name: the ROWS given, else the last `--last`
    stored ones with a `workload` run; exits when there are none."""
    paths = [p.resolve() for p in args.rows] or stored_cycles(REPO / "benchmarks/results", args.last, workload)
    if not paths:
        sys.exit(f"no stored cycle has both its rows and a {workload} run")
    return paths


Judged = TypeVar("Judged")


def each_cycle(paths: list[Path], judge: Callable[[Path], Judged]) -> Iterator[Judged]:
    """`judge` of each cycle's rows in turn, each announced as it starts (a fit takes minutes)."""
    for path in paths:
        print(f"{path.parent.name}/{path.name}: fitting ...", flush=True)
        yield judge(path)


def run_of(rows_path: Path, workload: str = "dlrm") -> Path:
    """The `workload` run stored beside a cycle's rows."""
    match = ROWS.match(rows_path.name)
    if match is None:
        raise SystemExit(f"ROWS: expected measurements_HHMM.jsonl.gz, got {rows_path.name}")
    return rows_path.with_name(f"{workload}_{match.group(1)}.json")


def below_steps(rows: list[Measurement], rows_path: Path, models: Path | None) -> PerformanceModel:
    """The cycle's bundle below the steps: from `models` when kept there, else fitted (and kept)."""
    kept = models / f"{rows_path.parent.name}_{rows_path.name.split('.')[0]}" if models else None
    if kept is not None and (kept / "performance_model.json").exists():
        return PerformanceModel.load_dir(kept)
    model, _ = fit_below_steps(rows, "refit", seed=0)
    if kept is not None:
        model.save(kept)
    return model


def feature_sets(feature: str) -> dict[str, list[str]]:
    """The paired fits' features: the default with `feature` (added when a candidate) and without."""
    every = list(dlrm_estimator.OVERHEAD_FEATURES)
    with_it = every if feature in every else [*every, feature]
    return {"with": with_it, "without": [f for f in with_it if f != feature]}


def step_table(model: PerformanceModel, rows: list[Measurement]) -> list[dict]:
    """Each DLRM step of the calibration: measured, its kernels as `model` prices them, what it
    leaves over them, and the overhead's kernel features (ms), to read a feature's verdict by."""
    table = []
    for row in rows:
        if row.op != DLRM_STEP_OP:
            continue
        kernels = estimate_step(model, row, include_overhead=False, simulate_graph=True)
        params = kernels.overhead_params
        table.append(
            {
                "tables": params["tables_total"],
                "batch_size": row.params["job"]["batch_size"],
                "measured_ms": row.median_s * 1e3,
                "kernels_ms": kernels.iteration_s * 1e3,
                "residual_ms": (row.median_s - kernels.iteration_s) * 1e3,
                **{
                    f.removesuffix("_s") + "_ms": params[f] * 1e3
                    for f in (*KERNEL_CLASSES, *dlrm_estimator.CANDIDATE_FEATURES)
                },
            }
        )
    return table


def load_cycle(rows_path: Path, models: Path | None) -> tuple[list[Measurement], dict, PerformanceModel]:
    """A stored cycle's rows, its DLRM run and its bundle below the steps (`below_steps`)."""
    rows = read_rows(rows_path)
    return rows, json.loads(run_of(rows_path).read_text()), below_steps(rows, rows_path, models)


def shown_path(rows_path: Path) -> str:
    """A cycle's rows as a result names them: relative to the repository where they lie in it."""
    return str(rows_path.relative_to(REPO)) if rows_path.is_relative_to(REPO) else str(rows_path)


def refit_run(
    below: PerformanceModel,
    rows: list[Measurement],
    result: dict,
    overhead_features: OverheadFeatures = OVERHEAD_FEATURES,
    every_dlrm_step: bool = False,
) -> tuple[PerformanceModel, list[dict]]:
    """The step stage fitted on `rows` over a copy of `below` (its overheads on
    `overhead_features`, the DLRM's on every kind of step with `every_dlrm_step`), and the
    stored DLRM run's tasks re-predicted under it (`refit_e2e.dlrm_predictions`; their
    figures: `refit_e2e.run_summary`)."""
    model = copy.deepcopy(below)
    fit_step_stage(model, rows, seed=0, overhead_features=overhead_features, every_dlrm_step=every_dlrm_step)
    return model, dlrm_predictions(model, result)


def judge_cycle(rows_path: Path, feature: str, models: Path | None = None) -> dict:
    """One cycle's steps and DLRM run, with the step overhead fitted with and without
    `feature`, on the same kernel models."""
    rows, result, below = load_cycle(rows_path, models)
    out: dict = {"rows": shown_path(rows_path)}
    fitted = {}
    for label, features in feature_sets(feature).items():
        model, tasks = refit_run(below, rows, result, {"dlrm": features})
        summary = run_summary(tasks)
        fitted[label] = model
        overhead = model.step_overheads.get("dlrm")
        steps = model.metrics.get(DLRM_STEP_OP) or {}
        out[label] = {
            "steps_left_out_gmae": steps.get("gmae"),
            "steps": steps.get("n"),
            "coefficients": None if overhead is None else dict(zip(overhead.features, map(float, overhead.coef))),
            "met": run_meets_bars(summary),
            **{k: summary[k] for k in ("geomean_error", "mean_signed_error", "max_error", "tasks")},
        }
    out["steps"] = step_table(fitted["without"], rows)  # priced as the default fit prices them
    return out


def print_large_steps(steps: list[dict], above_ms: float = 10.0) -> None:
    """The steps with over `above_ms` of memory-bound kernels (what the memory coefficient rests
    on): what the other ranks run beside them, and what they leave over their kernels, each as a
    share of their memory-bound time; and how many steps have kernels under `above_ms`."""
    small = sum(s["kernels_ms"] < above_ms for s in steps)
    print(f"  {small} of {len(steps)} steps have kernels under {above_ms:.0f} ms; those with more memory-bound time:")
    for s in sorted(steps, key=lambda s: -s["memory_ms"]):
        if s["memory_ms"] > above_ms:
            print(
                f"    {s['tables']:3.0f} tables, batch {s['batch_size']:5d}: memory-bound {s['memory_ms']:5.1f} ms, "
                f"alongside {s['memory_alongside_ms'] / s['memory_ms']:.2f} of it, left over "
                f"{s['residual_ms'] / s['memory_ms']:+.2f} of it"
            )


def paired(cycles: list[dict], key: str) -> dict | None:
    """The mean change with / without the feature in `key` over the cycles, and its interval."""
    return mean_change([c["with"][key] - c["without"][key] for c in cycles])


def cycle_key(cycle: dict) -> str:
    """A judged cycle's rows file as two outputs are matched by: its folder and name (the rows
    may have been named from another directory)."""
    return "/".join(cycle["rows"].split("/")[-2:])


def change_text(change: dict, digits: int = 1) -> str:
    """A paired change (`evaluation.mean_change`) as text: its mean and, from two cycles, its
    interval, in percent to `digits` places."""
    ci = change["interval"]
    mean = f"{change['mean_change']:+.{digits}%}"
    return mean + (f" [{ci[0]:+.{digits}%}, {ci[1]:+.{digits}%}]" if ci else "")


def default_arm(feature: str) -> str:
    """The arm of a run that is the default fit: "with" a default feature, "without" a candidate."""
    return "with" if feature in dlrm_estimator.OVERHEAD_FEATURES else "without"


def paired_change(pairs: Sequence[tuple[Any, Any]], of: Callable[[Any], float | None]) -> dict | None:
    """The mean change of `of` from the first of each pair to the second (two fits or codes of
    one run), over the pairs where both have it, with its interval (`evaluation.mean_change`)."""
    values = [(of(a), of(b)) for a, b in pairs]
    return mean_change([b - a for a, b in values if a is not None and b is not None])


def pair_outputs(before: dict, after: dict) -> dict:
    """Two outputs of this benchmark written by two codes on the same cycles (and bundles):
    their default fits' change, cycle by cycle matched by their rows' file, as the mean change
    with its interval of the run's geomean, worst and |mean signed| error and of the steps left
    out in turn, and the cycles meeting #26's bars each way. How a change below the overhead
    (a step-stage rule, the in-step factors) is judged on the DLRM runs."""
    earlier = {cycle_key(c): c[default_arm(before["feature"])] for c in before["cycles"]}
    pairs = [
        (earlier[cycle_key(c)], c[default_arm(after["feature"])]) for c in after["cycles"] if cycle_key(c) in earlier
    ]
    figures = {
        "geomean_error": lambda arm: arm["geomean_error"],
        "max_error": lambda arm: arm["max_error"],
        "abs_mean_signed_error": lambda arm: abs(arm["mean_signed_error"]),
        "steps_left_out_gmae": lambda arm: arm["steps_left_out_gmae"],
    }
    out: dict = {}
    for name, of in figures.items():
        out[name] = paired_change(pairs, of)
    out["bars_met"] = [sum(a["met"] for a, _ in pairs), sum(b["met"] for _, b in pairs)]
    return out


def print_pairing(paired_figures: dict) -> None:
    for name, row in paired_figures.items():
        if row is None:  # no cycle had the figure both ways
            continue
        if name == "bars_met":
            print(f"bars met: {row[0]} -> {row[1]}")
            continue
        print(f"{name}: after - before {change_text(row, 2)} over {row['cycles']} cycles")


PAIR = "pair"  # FEATURE's other use: pair two stored outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    features = [f for f in dlrm_estimator.OVERHEAD_FEATURES if f != "one"] + dlrm_estimator.CANDIDATE_FEATURES
    parser.add_argument(
        "feature", choices=[*features, PAIR], help=f"a feature to judge, or {PAIR} with two outputs as ROWS"
    )
    add_cycle_arguments(parser)
    args = parser.parse_args()
    if args.feature == PAIR:  # two stored outputs, nothing fitted
        if len(args.rows) != 2:
            parser.error(f"{PAIR} takes two of this benchmark's outputs: BEFORE.json AFTER.json, got {len(args.rows)}")
        before, after = (json.loads(path.read_text()) for path in args.rows)
        print_pairing(pair_outputs(before, after))
        return
    cycles = []
    for cycle in each_cycle(chosen_cycles(args), lambda path: judge_cycle(path, args.feature, args.models)):
        cycles.append(cycle)
        for label in ("with", "without"):
            c = cycle[label]
            steps = c["steps_left_out_gmae"]
            print(
                f"  {label:7s} {args.feature}: steps left out {steps if steps is None else f'{steps:.1%}'} "
                f"(n={c['steps']}); DLRM geomean {c['geomean_error']:.1%}, signed {c['mean_signed_error']:+.1%}, "
                f"max {c['max_error']:.1%}, bars {'met' if c['met'] else 'missed'}",
                flush=True,
            )
        print_large_steps(cycle["steps"])
    summary = {key: paired(cycles, key) for key in ("geomean_error", "max_error", "mean_signed_error")}
    met = {label: sum(c[label]["met"] for c in cycles) for label in ("with", "without")}
    for key, row in summary.items():
        print(f"{key}: with - without {change_text(row)} over {row['cycles']} cycles")
    print(f"bars met: {met['with']} of {len(cycles)} with, {met['without']} without")
    named = " ".join(map(str, args.rows)) if args.rows else f"--last {args.last}"
    command = f"python benchmarks/overhead_feature_refit.py {args.feature} {named}"
    out = args.out or str(REPO / f"benchmarks/results/overhead_feature_{args.feature}.json")
    result = {"command": command.strip(), "feature": args.feature, "cycles": cycles, "paired": summary, "met": met}
    print(f"wrote {write_result(out, result)}")


if __name__ == "__main__":
    main()

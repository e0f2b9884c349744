"""Does a step overhead that slows each class of kernel by its own share (GEMMs, memory-bound
lookups and element-wise ops, collectives: `predictors.kernel_classes`) hold better than one
slowdown on all the kernels (`kernels_s`)?

    .venv/bin/python benchmarks/kernel_class_split.py [--judge 7] [--base-cache DIR] MEASUREMENTS [MEASUREMENTS ...]

MEASUREMENTS: stored calibrations of one hardware, oldest first, as `benchmarks/pooled_steps.py`
takes them (`measurements_T.jsonl.gz` with the cycle's `dlrm_T.json` and `transformer_T.json`
beside it). Each of the newest `--judge` calibrations is fitted as it would be now without its
steps (`fit.fit_bundle`); then both workloads' step overheads are fitted as a calibration fits
them (its own steps and the three calibrations' before it, `step_pool.fit_pooled_steps`) once
on each feature set, side by side. Reported per calibration and variant: its own steps, each
left out in turn (GMAE), and the jobs its e2e benchmarks measured, re-predicted (geomean, max,
signed); then over the calibrations, `pooled_steps.summarize`'s figures.

A bundle fitted without steps depends only on the rows and the kernel fits' code (10-15 min
each on the 2-core host): `--base-cache DIR` keeps them there as JSON and reuses them on the
next run with the same code (delete the directory after changing a kernel fit). Writes
benchmarks/results/kernel_class_split.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.pooled_steps import cycle_files, judged, line, summarize, with_history  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.kernel_classes import ALL_KERNELS, KERNEL_CLASSES, one_slowdown  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import OVERHEAD_FEATURES, STEP_OP_OF, STEP_OPS, OverheadFeatures  # noqa: E402
from predictors.step_pool import EARLIER_CALIBRATIONS, EarlierCalibration, StepHistory  # noqa: E402

VARIANTS: dict[str, OverheadFeatures] = {
    "one slowdown": {workload: one_slowdown(names) for workload, names in OVERHEAD_FEATURES.items()},
    "kernel classes": OVERHEAD_FEATURES,
}


def slowdown(model: PerformanceModel, workload: str) -> dict[str, float]:
    """The fitted overhead's share of each kernel feature (the step's slowdown of that class)."""
    overhead = model.step_overheads[workload]
    coef = dict(zip(getattr(overhead, "features", []), getattr(overhead, "coef", [])))
    return {f: float(c) for f, c in coef.items() if f in (*KERNEL_CLASSES, ALL_KERNELS)}


def base_state(rows: list, label: str, cache: Path | None) -> dict:
    """The bundle fitted on `rows` without their steps, from `cache` when it holds it."""
    cached = cache / f"base_{label}.json" if cache is not None else None
    if cached is not None and cached.is_file():
        return json.loads(cached.read_text())
    base, _ = fit_bundle([r for r in rows if r.op not in STEP_OPS], "refit", seed=0)
    state = base.to_dict()
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(state))
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measurements", type=Path, nargs="+", help="stored calibrations of one hardware, oldest first")
    parser.add_argument("--judge", type=int, default=7, help="how many of the newest calibrations to judge")
    parser.add_argument("--base-cache", type=Path, help="keep (and reuse) the bundles fitted without steps here")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "kernel_class_split.json"))
    args = parser.parse_args()
    if args.judge < 1:
        parser.error("--judge must be >= 1")
    cycles = [cycle_files(p) for p in args.measurements]
    stored = [read_rows(c["rows"]) for c in cycles]
    results = []
    for i in range(max(0, len(cycles) - args.judge), len(cycles)):
        name = cycles[i]["rows"].name
        base = base_state(stored[i], name.split(".")[0], args.base_cache)
        earlier = range(i - 1, max(-1, i - 1 - EARLIER_CALIBRATIONS), -1)  # newest first, as a calibration finds them
        history = StepHistory({}, [EarlierCalibration(cycles[j]["rows"].name, stored[j]) for j in earlier])
        print(f"{name}:", flush=True)
        for label, features in VARIANTS.items():
            model = with_history(base, stored[i], history, features)
            steps = {w: model.metrics[op]["gmae"] for w, op in STEP_OP_OF.items() if op in model.metrics}
            slowdowns = {w: slowdown(model, w) for w in model.step_overheads}
            scores = judged(model, cycles[i])
            left_out = ", ".join(f"{w} steps {g:.1%}" for w, g in steps.items())
            print(f"  {line(label, scores)}  left out in turn: {left_out}", flush=True)
            for workload, shares in slowdowns.items():
                print(f"      {workload} slowdown: " + ", ".join(f"{f} {c:.3f}" for f, c in shares.items()))
            results.append({"cycle": name, "variant": label, "steps_gmae": steps, "slowdowns": slowdowns, **scores})
    summary = summarize(results)
    for label in VARIANTS:
        for workload in STEP_OP_OF:
            gmaes = [
                r["steps_gmae"][workload] for r in results if r["variant"] == label and workload in r["steps_gmae"]
            ]
            if gmaes:
                mean = sum(gmaes) / len(gmaes)
                summary[label][f"{workload}_steps_gmae"] = mean
                print(
                    f"{label:18s} {workload} steps left out in turn: mean GMAE {mean:.1%} over {len(gmaes)} calibrations"
                )
    command = "python benchmarks/kernel_class_split.py " + " ".join(
        ["--judge", str(args.judge), *map(str, args.measurements)]
    )
    print(f"wrote {write_result(args.out, {'command': command, 'results': results, 'summary': summary})}")


if __name__ == "__main__":
    main()

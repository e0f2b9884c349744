"""Does fitting the step overheads on the whole steps of several calibrations of one hardware
hold better on fresh jobs than fitting them on the newest calibration's steps alone?

    .venv/bin/python benchmarks/pooled_steps.py [--pool 1 2 3] [--judge 4] MEASUREMENTS [MEASUREMENTS ...]
    .venv/bin/python benchmarks/pooled_steps.py --summarize benchmarks/results/pooled_steps.json

MEASUREMENTS: stored calibrations of one hardware, oldest first (`measurements_T.jsonl.gz`,
with that cycle's `dlrm_T.json` and `transformer_T.json` beside it, as the #26 cycles keep
them; all of this host, on the same software, which the files do not record). Each of the
newest `--judge` calibrations is fitted as it would be now without its steps
(`fit.fit_bundle`), then its step overheads and in-step factors are fitted as a calibration
fits them (`step_pool.fit_pooled_steps`) on its own steps alone and, for each `--pool` k,
with the steps the k calibrations before it lend (only earlier ones: what a calibration
would have found stored; one whose kernels ran off this one's speed lends none). Each variant re-predicts the jobs that cycle's e2e benchmarks measured, side by
side with the others: the jobs' times are one spell's, only the step fit differs.

Why: three champions priced the same measured steps 10-14% apart
(`benchmarks/step_drift_cross.py`), each within its interval of zero on its own
calibration's eight table-wise steps: the step model's level follows the calibration's
draw of steps, and more steps of the same hardware would average that draw out.
Writes benchmarks/results/pooled_steps.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.issue26_tally import meets_bars  # noqa: E402
from benchmarks.refit_e2e import dlrm_predictions, read_rows, run_summary, transformer_predictions  # noqa: E402
from predictors.fit import fit_bundle, kernel_rows  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import OVERHEAD_FEATURES, STEP_OPS, OverheadFeatures  # noqa: E402
from predictors.step_pool import EarlierCalibration, StepHistory, fit_pooled_steps  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

STAMP = re.compile(r"measurements_(.+)\.jsonl(\.gz)?$")


def cycle_files(path: Path) -> dict[str, Path | None]:
    """A cycle's stored rows and the e2e results beside them (None where a benchmark was not run)."""
    match = STAMP.search(path.name)
    if not match:
        raise SystemExit(f"{path}: expected a name measurements_<stamp>.jsonl[.gz]")
    stamp = match.group(1)
    found = {kind: path.with_name(f"{kind}_{stamp}.json") for kind in ("dlrm", "transformer")}
    return {"rows": path, **{k: (p if p.is_file() else None) for k, p in found.items()}}


def with_history(
    base: dict, rows: list[Measurement], history: StepHistory | None, features: OverheadFeatures = OVERHEAD_FEATURES
) -> PerformanceModel:
    """The bundle fitted without steps, its step overheads (on `features`) and in-step factors
    fitted as a calibration fits them (`step_pool.fit_pooled_steps`) on its own steps and what
    `history` lends."""
    model = PerformanceModel.from_dict(base)
    fit_pooled_steps(model, [r for r in rows if r.op in STEP_OPS], kernel_rows(rows), history, 0, features)
    return model


def judged(model: PerformanceModel, files: dict[str, Path | None]) -> dict[str, dict]:
    """The cycle's e2e jobs re-predicted by `model`: DLRM and transformer data parallel."""
    out = {}
    if files["dlrm"] is not None:
        out["dlrm"] = run_summary(dlrm_predictions(model, json.loads(files["dlrm"].read_text())))
    if files["transformer"] is not None:
        out["transformer_dp"] = run_summary(
            transformer_predictions(model, json.loads(files["transformer"].read_text())["tasks"])
        )
    return out


def line(label: str, scores: dict[str, dict]) -> str:
    parts = [label.ljust(22)]
    for name in ("dlrm", "transformer_dp"):
        s = scores.get(name)
        parts.append(
            f"{name} geomean {s['geomean_error']:5.1%} max {s['max_error']:5.1%} signed {s['mean_signed_error']:+6.1%}"
            if s
            else f"{name} not run"
        )
    return "  ".join(parts)


def summarize(results: list[dict]) -> dict[str, dict[str, dict]]:
    """Per step-fit variant and workload, over the judged runs: the runs' mean signed error
    (mean and spread), their mean |signed| error, and how many met every bar."""
    out: dict[str, dict[str, dict]] = {}
    for variant in dict.fromkeys(r["variant"] for r in results):
        for workload in ("dlrm", "transformer_dp"):
            scores = [r[workload] for r in results if r["variant"] == variant and workload in r]
            if not scores:
                continue
            signed = np.array([s["mean_signed_error"] for s in scores])
            out.setdefault(variant, {})[workload] = {
                "runs": len(scores),
                "mean_signed": float(signed.mean()),
                "sd_signed": float(signed.std()),
                "mean_abs_signed": float(np.abs(signed).mean()),
                "met": sum(meets_bars(s["geomean_error"], s["max_error"], s["mean_signed_error"]) for s in scores),
            }
            print(
                f"{variant:18s} {workload:15s} over {len(scores)} runs: mean signed {signed.mean():+.1%} "
                f"(sd {signed.std():.1%}), mean |signed| {np.abs(signed).mean():.1%}, "
                f"bars met {out[variant][workload]['met']} of {len(scores)}"
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measurements", type=Path, nargs="*", help="stored calibrations of one hardware, oldest first")
    parser.add_argument("--pool", type=int, nargs="+", default=[1, 2, 3], help="earlier calibrations to add (each k)")
    parser.add_argument("--judge", type=int, default=4, help="how many of the newest calibrations to judge")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pooled_steps.json"))
    parser.add_argument("--summarize", type=Path, help="only summarize an earlier run's JSON (and write it back)")
    args = parser.parse_args()
    if args.summarize is not None:
        data = json.loads(args.summarize.read_text())
        data["summary"] = summarize(data["results"])
        print(f"wrote {write_result(str(args.summarize), data)}")
        return
    if not args.measurements:
        parser.error("MEASUREMENTS: expected stored calibrations' rows (or --summarize JSON)")
    if args.judge < 1 or any(k < 1 for k in args.pool):
        parser.error("--judge and every --pool must be >= 1")
    cycles = [cycle_files(p) for p in args.measurements]
    stored = [read_rows(c["rows"]) for c in cycles]
    results = []
    for i in range(max(0, len(cycles) - args.judge), len(cycles)):
        base, _ = fit_bundle([r for r in stored[i] if r.op not in STEP_OPS], "refit", seed=0)
        base_state = base.to_dict()
        variants: dict[str, StepHistory | None] = {"own steps": None}
        for k in args.pool:
            if i - k >= 0:  # the k calibrations before this one, newest first (as a calibration finds them)
                earlier = [EarlierCalibration(cycles[j]["rows"].name, stored[j]) for j in range(i - 1, i - k - 1, -1)]
                variants[f"own + {k} earlier"] = StepHistory({}, earlier)
        print(f"{cycles[i]['rows'].name}:", flush=True)
        for label, history in variants.items():
            model = with_history(base_state, stored[i], history)
            verdicts = model.meta.get("pooled_steps", [])
            lent = sum(v["steps"] for v in verdicts if v["pooled"])
            scores = judged(model, cycles[i])
            print("  " + line(f"{label} (+{lent})", scores), flush=True)
            for v in verdicts:
                print(f"      {v['label']}: {'pooled' if v['pooled'] else 'not pooled'}, {v['why']}")
            results.append(
                {"cycle": cycles[i]["rows"].name, "variant": label, "lent_steps": lent, "verdicts": verdicts, **scores}
            )
    command = "python benchmarks/pooled_steps.py " + " ".join(
        ["--pool", *map(str, args.pool), "--judge", str(args.judge), *map(str, args.measurements)]
    )
    summary = summarize(results)
    print(f"wrote {write_result(args.out, {'command': command, 'results': results, 'summary': summary})}")


if __name__ == "__main__":
    main()

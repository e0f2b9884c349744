"""Does fitting the step overheads on the whole steps of several calibrations of one hardware
hold better on fresh jobs than fitting them on the newest calibration's steps alone?

    .venv/bin/python benchmarks/pooled_steps.py [--pool 1 2 3] [--judge 4] [--models DIR] MEASUREMENTS [...]
    .venv/bin/python benchmarks/pooled_steps.py --summarize benchmarks/results/pooled_steps.json

MEASUREMENTS: stored calibrations of one hardware, oldest first (`measurements_T.jsonl.gz`,
with that cycle's `dlrm_T.json` and `transformer_T.json` beside it, as the #26 cycles keep
them; all of this host, on the same software, which the files do not record). Each of the
newest `--judge` calibrations is fitted as it would be now below its steps
(`overhead_feature_refit.below_steps`, kept in `--models DIR` to be reused), then its step
overheads and in-step factors are fitted as a calibration fits them
(`step_pool.fit_pooled_steps`) on its own steps alone and, for each `--pool` k, with the steps
the k calibrations before it lend (only earlier ones: what a calibration would have found
stored; one whose kernels ran off this one's speed lends none). Each variant re-predicts the
jobs that cycle's e2e benchmarks measured (DLRM, transformer data and tensor parallel), side by
side with the others: the jobs' times are one spell's, only the step fit differs, so each
variant against its own steps is a paired comparison; over the runs, the summary gives the
mean paired change of each run figure with its 95% interval.

Why: three champions priced the same measured steps 10-14% apart
(`benchmarks/step_drift_cross.py`), each within its interval of zero on its own
calibration's eight table-wise steps: the step model's level follows the calibration's
draw of steps, and more steps of the same hardware would average that draw out. The #26
cycles calibrate into fresh stores, so the product's pooling is never exercised by them; this
is where it is judged. Writes benchmarks/results/pooled_steps.json (or `--out`) after every
judged calibration, so a stopped run keeps what it judged.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.issue26_tally import RUN_FIGURES, run_meets_bars  # noqa: E402
from benchmarks.overhead_feature_refit import below_steps, paired_change  # noqa: E402
from benchmarks.refit_e2e import dlrm_predictions, read_rows, run_summary, transformer_predictions  # noqa: E402
from predictors.fit import kernel_rows  # noqa: E402
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
    base: dict,
    rows: list[Measurement],
    history: StepHistory | None,
    features: OverheadFeatures = OVERHEAD_FEATURES,
    rescale_lent: bool = False,
) -> PerformanceModel:
    """The bundle fitted without steps, its step overheads (on `features`) and in-step factors
    fitted as a calibration fits them (`step_pool.fit_pooled_steps`) on its own steps and what
    `history` lends (at this calibration's speed where `rescale_lent`)."""
    model = PerformanceModel.from_dict(base)
    steps = [r for r in rows if r.op in STEP_OPS]
    fit_pooled_steps(model, steps, kernel_rows(rows), history, 0, features, rescale_lent=rescale_lent)
    return model


OWN = "own steps"
AT_SPEED = " at this speed"  # a pooled variant's label with its lent steps rescaled (`step_pool.at_speed`)
WORKLOADS = ("dlrm", "transformer_dp")  # the runs #26's bars judge; TP's geomean is shown beside
WORKLOAD_WIDTH = 15  # the workload column of `summarize`'s lines


def judged(model: PerformanceModel, files: dict[str, Path | None]) -> dict[str, dict]:
    """The cycle's e2e jobs re-predicted by `model`: DLRM, transformer data parallel and (where
    the run had them) tensor parallel."""
    out = {}
    if files["dlrm"] is not None:
        out["dlrm"] = run_summary(dlrm_predictions(model, json.loads(files["dlrm"].read_text())))
    if files["transformer"] is not None:
        run = json.loads(files["transformer"].read_text())
        out["transformer_dp"] = run_summary(transformer_predictions(model, run["tasks"]))
        if run.get("tensor_parallel_tasks"):
            out["transformer_tp"] = run_summary(transformer_predictions(model, run["tensor_parallel_tasks"]))
    return out


def line(label: str, scores: dict[str, dict], width: int = 22) -> str:
    """One run's figures after `label`, padded to `width` (the longest label beside it)."""
    parts = [label.ljust(width)]
    for name in WORKLOADS:
        s = scores.get(name)
        parts.append(
            f"{name} geomean {s['geomean_error']:5.1%} max {s['max_error']:5.1%} signed {s['mean_signed_error']:+6.1%}"
            if s
            else f"{name} not run"
        )
    if "transformer_tp" in scores:
        parts.append(f"tp geomean {scores['transformer_tp']['geomean_error']:5.1%}")
    return "  ".join(parts)


def summarize(results: list[dict]) -> dict[str, dict[str, dict]]:
    """Per step-fit variant and workload, over the judged runs: the runs' mean signed error
    (mean and spread), their mean |signed| error, how many met every bar, and (for a variant
    other than the own steps) each run figure's mean paired change from the own steps' fit of
    the same run, with its 95% interval (`paired_changes`). A variant whose lent steps were
    rescaled is also paired with the same pooling as it is (`against_as_is`), over the runs
    that lent something: elsewhere the two fits are one."""
    out: dict[str, dict[str, dict]] = {}
    by_run = {(r["cycle"], r["variant"]): r for r in results}
    own = {r["cycle"]: r for r in results if r["variant"] == OWN}
    variants = list(dict.fromkeys(r["variant"] for r in results))
    width = max(map(len, variants), default=0)  # the variants' column, and the changes' indent below it
    for variant in variants:
        for workload in WORKLOADS:
            scores = [r[workload] for r in results if r["variant"] == variant and workload in r]
            if not scores:
                continue
            signed = np.array([s["mean_signed_error"] for s in scores])
            figures: dict = {
                "runs": len(scores),
                "mean_signed": float(signed.mean()),
                "sd_signed": float(signed.std()),
                "mean_abs_signed": float(np.abs(signed).mean()),
                "mean_geomean": float(np.mean([s["geomean_error"] for s in scores])),
                "met": sum(run_meets_bars(s) for s in scores),
            }
            if variant != OWN and own:  # no own-steps fit judged (another script's variants): nothing to pair
                pairs = [(own[r["cycle"]], r) for r in results if r["variant"] == variant and r["cycle"] in own]
                figures["paired"] = paired_changes(pairs, workload)
            if variant.endswith(AT_SPEED):
                as_is = variant.removesuffix(AT_SPEED)
                pairs = [
                    (by_run[(r["cycle"], as_is)], r)
                    for r in results
                    if r["variant"] == variant and r["lent_steps"] > 0 and (r["cycle"], as_is) in by_run
                ]
                figures["against_as_is"] = paired_changes(pairs, workload)
            out.setdefault(variant, {})[workload] = figures
            print(
                f"{variant:{width}s} {workload:{WORKLOAD_WIDTH}s} over {len(scores)} runs: mean signed {signed.mean():+.1%} "
                f"(sd {signed.std():.1%}), mean |signed| {np.abs(signed).mean():.1%}, "
                f"mean geomean {figures['mean_geomean']:.1%}, bars met {figures['met']} of {len(scores)}"
            )
            for against, key in ((OWN, "paired"), ("as is", "against_as_is")):
                for figure, change in figures.get(key, {}).items():
                    if change is not None:
                        low, high = change["interval"] or (float("nan"), float("nan"))
                        print(
                            f"{'':{width + 1 + WORKLOAD_WIDTH + 1}s}{figure} change from {against} {change['mean_change'] * 100:+.2f} points "
                            f"[{low * 100:+.2f}, {high * 100:+.2f}] over {change['cycles']} runs"
                        )
        judged_both = [r for r in results if r["variant"] == variant and all(w in r for w in WORKLOADS)]
        if judged_both:  # the runs where both workloads met every bar (#26 asks it of both)
            both = sum(all(run_meets_bars(r[w]) for w in WORKLOADS) for r in judged_both)
            out.setdefault(variant, {})["both"] = {"runs": len(judged_both), "met": both}
            print(f"{variant:{width}s} {'both':{WORKLOAD_WIDTH}s} bars met {both} of {len(judged_both)}")
    return out


def paired_changes(pairs: list[tuple[dict, dict]], workload: str) -> dict[str, dict | None]:
    """Each of `workload`'s run figures (and |signed|, and for the transformer TP's geomean) as
    the variant moves it from the own steps' fit of the same run: mean change and interval."""

    change = partial(paired_change, pairs)  # of a function: a judged cycle -> the figure, or None

    def figure(name: str, kind: str = workload):
        return lambda judged: judged[kind][name] if kind in judged else None

    changes = {name: change(figure(name)) for name in RUN_FIGURES}
    changes["abs_mean_signed_error"] = change(
        lambda j: abs(j[workload]["mean_signed_error"]) if workload in j else None
    )
    if workload == "transformer_dp":
        changes["tp_geomean_error"] = change(figure("geomean_error", "transformer_tp"))
    return changes


def judge_calibration(
    i: int,
    cycles: list[dict],
    stored: list[list[Measurement]],
    pools: list[int],
    models: Path | None,
    rescaled: bool = False,
) -> list[dict]:
    """The `i`th calibration's step stage fitted on its own steps and with each of `pools`'
    earlier calibrations lending theirs (and, where `rescaled`, lending them at this
    calibration's speed), on one below-steps bundle; each variant's judged runs."""
    below = below_steps(stored[i], cycles[i]["rows"], models)
    base_state = below.to_dict()
    variants: dict[str, tuple[StepHistory | None, bool]] = {OWN: (None, False)}
    for k in pools:
        if i - k >= 0:  # the k calibrations before this one, newest first (as a calibration finds them)
            earlier = [EarlierCalibration(cycles[j]["rows"].name, stored[j]) for j in range(i - 1, i - k - 1, -1)]
            variants[f"own + {k} earlier"] = (StepHistory({}, earlier), False)
            if rescaled:
                variants[f"own + {k} earlier{AT_SPEED}"] = (StepHistory({}, earlier), True)
    rows = cycles[i]["rows"]
    cycle = str(rows.relative_to(REPO)) if rows.is_relative_to(REPO) else rows.name
    print(f"{rows.name}:", flush=True)
    results = []
    width = max(map(len, variants)) + len(" (+000)")  # a label and the steps it was lent
    for label, (history, rescale_lent) in variants.items():
        model = with_history(base_state, stored[i], history, rescale_lent=rescale_lent)
        verdicts = model.meta.get("pooled_steps", [])
        lent = sum(v["steps"] for v in verdicts if v["pooled"])
        scores = judged(model, cycles[i])
        print("  " + line(f"{label} (+{lent})", scores, width), flush=True)
        for v in verdicts:
            print(f"      {v['label']}: {'pooled' if v['pooled'] else 'not pooled'}, {v['why']}")
        results.append({"cycle": cycle, "variant": label, "lent_steps": lent, "verdicts": verdicts, **scores})
    return results


def resummarized(paths: list[Path], out: str) -> tuple[str, dict]:
    """Where to write and what: one earlier output summarized again (written back), or several
    judged apart (one per host, whose calibrations never lend to each other) summarized as one
    (written to `out`: the commands that judged them and the one that joined them kept, and
    complete only where every part was)."""
    outputs = [json.loads(path.read_text()) for path in paths]
    if len(outputs) == 1:
        return str(paths[0]), {**outputs[0], "summary": summarize(outputs[0]["results"])}
    results = [r for data in outputs for r in data["results"]]
    commands = [c for data in outputs for c in data.get("commands") or [data["command"]]]
    joined = " ".join(["python benchmarks/pooled_steps.py --summarize", *map(str, paths), "--out", out])
    return out, {
        "commands": commands,
        "summarized_by": joined,
        "parts": [str(p) for p in paths],
        "complete": all(data.get("complete", True) for data in outputs),
        "results": results,
        "summary": summarize(results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measurements", type=Path, nargs="*", help="stored calibrations of one hardware, oldest first")
    parser.add_argument("--pool", type=int, nargs="+", default=[1, 2, 3], help="earlier calibrations to add (each k)")
    parser.add_argument("--judge", type=int, default=4, help="how many of the newest calibrations to judge")
    parser.add_argument("--models", type=Path, help="keep (and reuse) each calibration's below-steps bundle here")
    parser.add_argument(
        "--rescaled",
        action="store_true",
        help="each pooled variant also with its lent steps at this calibration's speed",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pooled_steps.json"))
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        help="only summarize earlier runs' JSON: one is written back, several (each host's, say) pooled into --out",
    )
    args = parser.parse_args()
    if args.summarize is not None:
        print(f"wrote {write_result(*resummarized(args.summarize, args.out))}")
        return
    if not args.measurements:
        parser.error("MEASUREMENTS: expected stored calibrations' rows (or --summarize JSON)")
    if args.judge < 1 or any(k < 1 for k in args.pool):
        parser.error("--judge and every --pool must be >= 1")
    cycles = [cycle_files(p.resolve()) for p in args.measurements]
    stored = [read_rows(c["rows"]) for c in cycles]
    command = "python benchmarks/pooled_steps.py " + " ".join(
        ["--pool", *map(str, args.pool), "--judge", str(args.judge)]
        + (["--rescaled"] if args.rescaled else [])
        + (["--models", str(args.models)] if args.models else [])
        + ["--out", str(args.out)]
        + list(map(str, args.measurements))
    )
    results: list[dict] = []
    for i in range(max(0, len(cycles) - args.judge), len(cycles)):
        results += judge_calibration(i, cycles, stored, args.pool, args.models, args.rescaled)
        write_result(args.out, {"command": command, "results": results, "complete": False})
    summary = summarize(results)
    print(
        f"wrote {write_result(args.out, {'command': command, 'results': results, 'summary': summary, 'complete': True})}"
    )


if __name__ == "__main__":
    main()

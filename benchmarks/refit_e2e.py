"""Re-predict a stored end-to-end accuracy run from a calibration's stored rows, with this code.

    .venv/bin/python benchmarks/refit_e2e.py ROWS RESULT [RESULT ...]

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`); RESULT: the JSON of
`benchmarks/e2e_accuracy.py` or `benchmarks/e2e_accuracy_transformer.py`. Fits the bundle
the calibration would fit now (`predictors.fit.fit_bundle`), rebuilds
each task (and, for DLRM, its sharder's plan) from the result's seed, predicts it, and
compares with the time the run measured. A model change can so be judged on the same
measured jobs, side by side with what was predicted then, without running them again: the
jobs' times are one spell's, and only the predictions differ. Prints per task and the summary.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import (  # noqa: E402
    error_summary,
    interval_text,
    signed_errors,
    signed_summary,
    task_plan,
    tasks_by_batch,
    write_result,
)
from predictors import dlrm_estimator  # noqa: E402
from predictors.dlrm_estimator import estimate_iteration  # noqa: E402
from predictors.fit import fit_bundle  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import STEP_WORKLOADS, in_step_verdict  # noqa: E402
from predictors.transformer_estimator import estimate_transformer_iteration  # noqa: E402
from probes.collective import merge_passes  # noqa: E402
from probes.vocabulary.ops import EMBEDDING_BWD_OP, EMBEDDING_FWD_OP, IN_CONTEXT_OP, IN_STEP_COLLECTIVE_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def read_rows(path: Path) -> list[Measurement]:
    """The stored rows, each collective's passes merged as the calibration merges them."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return merge_passes([Measurement.from_row(json.loads(line)) for line in f if line.strip()])


def dlrm_predictions(model: PerformanceModel, result: dict) -> list[dict]:
    tasks = random_dlrm_tasks(len(result["tasks"]), result["world_size"], result["task_seed"], result["scale"])
    out = []
    for i, (spec, row) in enumerate(zip(tasks, result["tasks"])):
        _, plan = task_plan(i, spec, result["task_seed"])
        out.append(
            {
                **row,
                "was_ms": row["predicted_ms"],
                "predicted_ms": estimate_iteration(spec, plan, model).iteration_s * 1e3,
            }
        )
    return out


def transformer_predictions(model: PerformanceModel, rows: list[dict]) -> list[dict]:
    return [
        {
            **row,
            "was_ms": row["predicted_ms"],
            "predicted_ms": estimate_transformer_iteration(TransformerSpec.from_dict(row["spec"]), model).iteration_s
            * 1e3,
        }
        for row in rows
    ]


def run_summary(rows: list[dict]) -> dict:
    """A run's figures from its re-predicted tasks: the errors' summary and the signed one."""
    return {
        **error_summary([abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rows]),
        **signed_summary(rows),
        "tasks": len(rows),
    }


def fitted_figures(model: PerformanceModel) -> dict:
    """What the refit fitted that its predictions rest on: each op's in-step factor and per-call
    addition (`in_context`), and each workload's step-overhead coefficients in seconds."""
    context = model.in_step
    return {
        "in_context": None
        if context is None
        else {op: {"factor": f, "add_s": context.adds.get(op, 0.0)} for op, f in sorted(context.factors.items())},
        "step_overheads": {
            w: dict(zip(m.features, (float(c) for c in m.coef))) for w, m in sorted(model.step_overheads.items())
        },
    }


def report(label: str, rows: list[dict]) -> dict:
    for r in rows:
        error = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"]
        print(
            f"  {r['name']:10s} measured {r['measured_ms']:8.2f}  now {r['predicted_ms']:8.2f} ({error:+6.1%})  then {r['was_ms']:8.2f}"
        )
    summary = run_summary(rows)
    by_batch = {b: float(signed_errors(tasks).mean()) for b, tasks in tasks_by_batch(rows).items()}
    if by_batch:
        summary["signed_by_batch"] = by_batch
        print("  mean signed by batch: " + ", ".join(f"{b}: {e:+.1%}" for b, e in by_batch.items()))
    print(
        f"{label}: geomean {summary['geomean_error']:.1%}{interval_text(summary['geomean_interval'])}, "
        f"median {summary['median_error']:.1%}, max {summary['max_error']:.1%}, mean signed "
        f"{summary['mean_signed_error']:+.1%}{interval_text(summary['mean_signed_interval'], signed=True)} "
        f"over {len(rows)} tasks (95% intervals)"
    )
    return {"label": label, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument(
        "--without-tbe-in-step",
        action="store_true",
        help="refit without the captured steps' TBE lookups (in-context rows of embedding_fwd/bwd): their paired 'before'",
    )
    parser.add_argument("--out", help="also write the summaries (and the in-step collective figures) as JSON here")
    parser.add_argument(
        "--without-dlrm-overhead-feature",
        action="append",
        default=[],
        choices=[f for f in dlrm_estimator.OVERHEAD_FEATURES if f != "one"],
        help="refit with the DLRM step overhead lacking this feature (repeatable): a feature's paired 'before'",
    )
    args = parser.parse_args()
    dropped = set(args.without_dlrm_overhead_feature)
    features = [f for f in dlrm_estimator.OVERHEAD_FEATURES if f not in dropped]
    rows = read_rows(args.rows)
    if args.without_tbe_in_step:
        lookups = (EMBEDDING_FWD_OP, EMBEDDING_BWD_OP)
        rows = [r for r in rows if not (r.op == IN_CONTEXT_OP and r.params.get("model_op") in lookups)]
    model, _ = fit_bundle(rows, "refit", seed=0, overhead_features={"dlrm": features})
    for name in ("dlrm_step", "transformer_step"):
        stats = model.metrics.get(name)
        if stats:
            print(f"{name}: left out in turn {stats['gmae']:.1%} (n={stats['n']})")
    collectives = model.metrics.get(IN_STEP_COLLECTIVE_OP)
    if collectives:
        for workload in STEP_WORKLOADS.values():
            verdict = collectives.get(workload)
            if verdict:
                print(
                    f"in-step collectives of {workload}: held out {verdict['gmae']:.1%} per call (isolated price "
                    f"{verdict['baseline_gmae']:.1%}, n={verdict['n']}), total off by {verdict['total_error']:.1%} "
                    f"(isolated {verdict['baseline_total_error']:.1%})"
                )
        print("  " + in_step_verdict(collectives))
    summaries = []
    for path in args.results:
        result = json.loads(path.read_text())
        print(f"{path} (seed {result['task_seed']}):")
        if "world_size" in result and "scale" in result:
            summaries.append(report("DLRM", dlrm_predictions(model, result)))
        else:
            summaries.append(report("transformer, data parallel", transformer_predictions(model, result["tasks"])))
            if result.get("tensor_parallel_tasks"):
                summaries.append(
                    report(
                        "transformer, tensor parallel", transformer_predictions(model, result["tensor_parallel_tasks"])
                    )
                )
    if args.out:
        command = "benchmarks/refit_e2e.py " + " ".join(
            [
                str(args.rows),
                *map(str, args.results),
                *(f"--without-dlrm-overhead-feature {f}" for f in sorted(dropped)),
                *(["--without-tbe-in-step"] if args.without_tbe_in_step else []),
            ]
        )
        print(
            f"wrote {write_result(args.out, {'command': command, **fitted_figures(model), 'in_step_collective': collectives, 'summaries': summaries})}"
        )


if __name__ == "__main__":
    main()

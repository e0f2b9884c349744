"""Autotune a job: fingerprint, recalibrate if needed, plan with the predictor, launch, compare.

    python -m orchestrator.autotune --job J [--dry-run] [--recalibrate auto|always|never]
        [--tracking-uri U] [--ray-address A] [--plan-out P] [--calibration-budget-s S] [--json]

Everything lands in one MLflow run (experiment "autotune"): the calibration when one happens
(measurement table, held-out errors, registered model), the plan, the predicted and measured
iteration times and their relative error. `python -m orchestrator.autotune` (the product's entry
point, what `ray job submit` runs) and `python -m orchestrator.cli.autotune` are this command.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from orchestrator.cli.options import (
    EXIT_NO_MODEL,
    add_common,
    add_lock_timeout,
    age_days,
    budget_s,
    command_parser,
    emit,
    entry_point,
    int_in,
    output_file,
    parse,
)
from orchestrator.defaults import DEFAULT_BUDGET_S, DEFAULT_MODEL_AGE_DAYS
from orchestrator.progress import say
from probes.vocabulary.jobspec import MAX_ITERATIONS

EXAMPLES = (
    "python -m orchestrator.autotune --job examples/dlrm_small.yaml",
    "python -m orchestrator.autotune --job examples/transformer_small.yaml --dry-run --json",
    "python -m orchestrator.autotune --job examples/sweep_small.yaml",
    "ray job submit --working-dir . -- python -m orchestrator.autotune --job job.yaml --tracking-uri http://mlflow:5000",
)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("orchestrator.autotune", __doc__, EXAMPLES)
    parser.add_argument(
        "--job", required=True, help="job YAML file: a DLRM, a transformer or a sweep of fused trials (examples/*.yaml)"
    )
    parser.add_argument("--dry-run", action="store_true", help="plan and log, but do not launch the job")
    parser.add_argument(
        "--recalibrate",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: only when the models are missing, stale or drifting",
    )
    parser.add_argument(
        "--plan-out",
        type=output_file,
        help="write the plan JSON here (unset: $AUTOTUNE_HOME/plans/<job>-<hardware>.json)",
    )
    parser.add_argument(
        "--calibration-budget-s",
        type=budget_s,
        default=DEFAULT_BUDGET_S,
        help="probing time of a calibration, when one is needed (seconds)",
    )
    parser.add_argument(
        "--max-model-age-days",
        type=age_days,
        default=DEFAULT_MODEL_AGE_DAYS,
        help="a champion model older than this is recalibrated (with --recalibrate auto)",
    )
    parser.add_argument(
        "--iterations", type=int_in(1, MAX_ITERATIONS), help="timed iterations when launching (unset: the job's)"
    )
    add_lock_timeout(parser)
    add_common(parser)
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return parse(build_parser(), argv)


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from orchestrator.core_binding import binding_mode

    binding_mode()  # a bad AUTOTUNE_CORE_BINDING is refused (exit 2) before anything starts
    t0 = time.monotonic()
    from orchestrator.jobfile import load_any_job

    job = load_any_job(args.job)  # refused before Ray or MLflow are even imported
    from orchestrator import registry
    from orchestrator.autotuning import AutotuneSettings, autotune
    from orchestrator.cli.common import fingerprint
    from policies.planning import job_placement
    from probes.vocabulary.sweep_job import SweepJob

    uri = registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=True)
    if not isinstance(job, SweepJob):  # a sweep's fused jobs take one device each
        job_placement(job, fp)  # a job larger than the cluster: refused (world_size named) before calibrating
    say(f"hardware {fp.hardware_id}: {fp.summary()}; MLflow at {uri}")
    summary = autotune(
        job,
        fp,
        uri,
        AutotuneSettings(
            args.recalibrate,
            args.max_model_age_days,
            args.calibration_budget_s,
            args.lock_timeout_s,
            args.plan_out,
            args.dry_run,
            args.iterations,
        ),
        started=t0,
    )
    if summary is None:
        return EXIT_NO_MODEL
    emit(summary, args.json, lambda s: summary_table(s, uri))
    return 0


def summary_table(summary: dict, uri: str) -> None:
    """The figures a user came for, last: the plan, predicted and measured, where to look."""
    decided = summary.get("sharding") or summary.get("layout")
    rows = [("model", f"{summary['model']} ({'recalibrated' if summary['recalibrated'] else 'reused'})")]
    if "width" in summary:  # a sweep
        rows += [
            ("width", f"{summary['width']} fused per device (fusion curve {summary['curve']})"),
            ("trials", f"{summary['trials']} in {len(summary['groups'])} fused job(s) of {summary['groups']}"),
            ("predicted", f"{summary['predicted_samples_per_s']:.0f} samples/s per fused job"),
        ]
        if summary.get("measured_samples_per_s") is not None:
            rows.append(
                (
                    "measured",
                    f"{summary['measured_samples_per_s']:.0f} samples/s (error {summary['throughput_error']:.1%})",
                )
            )
        best = summary["best_trial"]
        rows.append(("best", f"{best['trial_id']} val_loss {best.get('val_loss', float('nan')):.4f} {best['config']}"))
    elif "plan" in summary:
        rows += [
            ("plan", f"{decided} -> {summary['plan']}"),
            ("predicted", f"{summary['predicted_iteration_ms']:.2f} ms/iteration"),
        ]
    if "measured_iteration_ms" in summary:
        rows.append(
            (
                "measured",
                f"{summary['measured_iteration_ms']:.2f} ms/iteration (error {summary['prediction_error']:.1%})",
            )
        )
    rows.append(("done in", f"{summary['wall_s']} s; mlflow ui --backend-store-uri {uri}"))
    for name, value in rows:
        say(f"{name:<10s} {value}")


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

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

from orchestrator import registry
from orchestrator.autotuning import AutotuneSettings, autotune
from orchestrator.calibrate import DEFAULT_BUDGET_S
from orchestrator.cli.common import (
    EXIT_NO_MODEL,
    ArgumentParser,
    add_common,
    add_lock_timeout,
    age_days,
    budget_s,
    emit,
    entry_point,
    fingerprint,
    int_in,
    output_file,
)
from orchestrator.jobfile import load_job
from orchestrator.progress import say
from policies.planning import job_placement
from probes.vocabulary.jobspec import MAX_ITERATIONS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m orchestrator.autotune", description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="job YAML file (see examples/)")
    parser.add_argument("--dry-run", action="store_true", help="plan and log, but do not launch the job")
    parser.add_argument(
        "--recalibrate",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: only when models are missing, stale or drifting (default)",
    )
    parser.add_argument(
        "--plan-out", type=output_file, help="write the plan JSON here (default .autotune/plans/<job>-<hardware>.json)"
    )
    parser.add_argument("--calibration-budget-s", type=budget_s, default=DEFAULT_BUDGET_S)
    parser.add_argument("--max-model-age-days", type=age_days, default=7.0)
    parser.add_argument(
        "--iterations", type=int_in(1, MAX_ITERATIONS), help="timed iterations when launching (default: the job's)"
    )
    add_lock_timeout(parser)
    add_common(parser)
    return parser.parse_args(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    job = load_job(args.job)
    uri = registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=True)
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
    emit(summary, args.json, lambda s: say(f"done in {s['wall_s']}s; browse with: mlflow ui --backend-store-uri {uri}"))
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

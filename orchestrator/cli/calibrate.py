"""Calibration: measure this cluster through Ray, fit the per-op models, register them.

    python -m orchestrator.cli.calibrate [--budget-s S] [--tracking-uri U] [--ray-address A] [--job J] [--json]
    python -m orchestrator.cli.calibrate --refit DIR | --resume DIR ...

Measurements are appended to `$AUTOTUNE_HOME/calibrations/<stamp>/measurements.jsonl` as each
probe returns and logged to MLflow before the fit runs, so nothing measured is lost to a
later failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from orchestrator.cli.options import (
    add_common,
    add_lock_timeout,
    budget_s,
    calibration_dir,
    command_parser,
    emit,
    entry_point,
    parse,
    seed,
)
from orchestrator.defaults import DEFAULT_BUDGET_S

EXAMPLES = (
    "python -m orchestrator.cli.calibrate --budget-s 300",
    "python -m orchestrator.cli.calibrate --job job.yaml --tracking-uri http://mlflow:5000 --json",
    "python -m orchestrator.cli.calibrate --refit .autotune/calibrations/<stamp>",
)


def refit_main(directory: Path, tracking_uri: str | None, seed: int, as_json: bool) -> int:
    """Fit and register from stored measurements, for the hardware that took them (its
    fingerprint is stored beside them: a multi-node calibration refits from any machine)."""
    if not (directory / "measurements.jsonl").exists():
        raise SystemExit(f"--refit {directory}: no measurements.jsonl there")
    if not (directory / "fingerprint.json").exists():
        raise SystemExit(f"--refit {directory}: no fingerprint.json there (the hardware the measurements came from)")
    from orchestrator import registry
    from orchestrator.calibrate import print_summary, refit

    uri = registry.configure(tracking_uri)
    emit({**refit(directory, seed), "tracking_uri": uri}, as_json, print_summary)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("orchestrator.cli.calibrate", __doc__, EXAMPLES)
    parser.add_argument("--budget-s", type=budget_s, default=DEFAULT_BUDGET_S, help="probing time (seconds)")
    parser.add_argument("--job", help="also measure the shapes this job file will be predicted at")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the sweep's points and of the held-out split")
    parser.add_argument(
        "--refit",
        metavar="DIR",
        type=calibration_dir,
        help="measure nothing: fit and register again from a calibration "
        "directory's measurements.jsonl (e.g. after the model code improved)",
    )
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a calibration of this cluster that was cut short: "
        "measure only the probe points its directory lacks, then fit and register",
    )
    add_lock_timeout(parser)
    add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if args.refit:
        return refit_main(Path(args.refit), args.tracking_uri, args.seed, args.json)
    from orchestrator.core_binding import binding_mode

    binding_mode()  # a bad AUTOTUNE_CORE_BINDING is refused (exit 2) before anything starts
    from orchestrator.jobfile import load_job
    from probes.vocabulary.jobspec import JobSpecError

    job = load_job(args.job) if args.job else None
    resume = Path(args.resume) if args.resume else None
    if resume is not None and not (resume / "fingerprint.json").exists():
        raise JobSpecError([f"--resume {resume}: not a calibration directory (no fingerprint.json there)"])
    from orchestrator import registry
    from orchestrator.calibrate import CalibrationRequest, calibrate_cluster, print_summary
    from orchestrator.cli.common import fingerprint

    uri = registry.configure(args.tracking_uri)
    request = CalibrationRequest(args.budget_s, job, args.seed, resume)
    info = calibrate_cluster(fingerprint(args.ray_address, start_ray=True), request, args.lock_timeout_s)
    emit({**info, "tracking_uri": uri}, args.json, print_summary)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

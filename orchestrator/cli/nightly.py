"""Recalibrate this cluster's hardware where its champion model is missing, older than the
allowed age, built on other driver / CUDA / NCCL / torch versions, drifting on launched jobs, or
off on its re-measured sentinel points; promote a new model only if it is not worse.

The rule is `orchestrator.nightly`'s; this module holds its options, output and exit codes.
Safe to start twice, on any pods: the second says who holds the nightly's lock and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from orchestrator.cli import options
from orchestrator.defaults import (
    DEFAULT_BUDGET_S,
    DEFAULT_MODEL_AGE_DAYS,
    DEFAULT_NIGHTLY_LOCK,
    DEFAULT_SENTINEL_BOUND,
    DEFAULT_SENTINEL_RATIO,
    DEFAULT_SENTINEL_SPEED_BOUND,
)
from orchestrator.progress import say

EXAMPLES = (
    "python -m orchestrator.cli.nightly --budget-s 1800",
    "python -m orchestrator.cli.nightly --max-model-age-days 3 --tracking-uri http://mlflow:5000 --json",
)


def build_parser() -> argparse.ArgumentParser:
    parser = options.command_parser("orchestrator.cli.nightly", __doc__, EXAMPLES)
    parser.add_argument(
        "--budget-s", type=options.budget_s, default=DEFAULT_BUDGET_S, help="calibration budget where one is needed"
    )
    parser.add_argument(
        "--lock",
        default=options.environment_default("AUTOTUNE_NIGHTLY_LOCK", DEFAULT_NIGHTLY_LOCK),
        help="name of the nightly's lock, held in the tracking server so every scheduler of "
        "this cluster sees it ($AUTOTUNE_NIGHTLY_LOCK)",
    )
    parser.add_argument(
        "--max-model-age-days",
        type=options.age_days,
        default=DEFAULT_MODEL_AGE_DAYS,
        help="a champion older than this is recalibrated",
    )
    parser.add_argument(
        "--sentinel-bound",
        type=options.number_in(0.0, 100.0),
        default=DEFAULT_SENTINEL_BOUND,
        help="sentinel GMAE that marks a champion stale, at least",
    )
    parser.add_argument(
        "--sentinel-ratio",
        type=options.number_in(0.0, 1000.0),
        default=DEFAULT_SENTINEL_RATIO,
        help="... or this many times its own held-out GMAE",
    )
    parser.add_argument(
        "--sentinel-speed-bound",
        type=options.number_in(1.0, 100.0),
        default=DEFAULT_SENTINEL_SPEED_BOUND,
        help="sentinels running this many times slower or faster than the calibration timed them: drift "
        "(unset: their speed is reported and logged, not acted on)",
    )
    parser.add_argument("--seed", type=options.seed, default=0, help="seed of a recalibration's sweep and split")
    options.add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = options.parse(build_parser(), argv)
    from orchestrator.core_binding import binding_mode

    binding_mode()  # a bad AUTOTUNE_CORE_BINDING is refused (exit 2) before anything starts
    from orchestrator import registry
    from orchestrator.cli.common import fingerprint
    from orchestrator.nightly import NightlySettings, nightly_lease, run_nightly

    uri = registry.configure(args.tracking_uri)
    # The nightly's lock lives in the tracking server (every scheduler pod sees it) and expires
    # when its holder stops renewing it: a nightly that died or hangs cannot hold it past its run.
    lock = nightly_lease(args.lock, args.budget_s)
    if not lock.try_acquire():
        current = lock.current()
        who = current[0] if current else "unknown"
        say(f"another nightly run holds {args.lock} ({who}); exiting without doing anything")
        options.emit({"skipped": True, "lock": args.lock, "holder": who}, args.json, lambda _: None)
        return 0
    try:
        summary = run_nightly(
            lambda: fingerprint(args.ray_address, start_ray=True),
            uri,
            NightlySettings(
                args.budget_s,
                args.max_model_age_days,
                args.sentinel_bound,
                args.sentinel_ratio,
                args.seed,
                args.sentinel_speed_bound,
            ),
        )
    finally:
        lock.release()

    def human(s: dict[str, Any]) -> None:
        for c in s["checked"]:
            what = (
                f"recalibrated → {c['model']} ({'promoted' if c['promoted'] else 'challenger'}: {c['promotion_reason']})"
                if c["recalibrated"]
                else "fresh, nothing recalibrated"
            )
            say(f"summary {c['hardware_id']}: {what}")
        for e in s["needs_nightly_on_its_own_hardware"]:
            say(f"summary {e['hardware_id']}: not in this cluster and " + "; ".join(e["reasons"]))
        say(f"nightly done in {s['wall_s']}s: {s['recalibrated']} recalibrated, {s['promoted']} promoted")

    options.emit(summary, args.json, human)
    return 0


main = options.entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

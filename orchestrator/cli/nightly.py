"""The nightly recalibration command: what it checks and when it recalibrates is
`orchestrator.nightly`'s rule; here are its options, its output and its exit codes.

    python -m orchestrator.cli.nightly [--budget-s S] [--lock PATH] [--ray-address A] [--tracking-uri U] [--json]

Safe to start twice, on any pods: the second says who holds the nightly's lock and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from orchestrator import registry
from orchestrator.calibrate import DEFAULT_BUDGET_S
from orchestrator.cli import common
from orchestrator.nightly import DEFAULT_LOCK, NightlySettings, nightly_lease, run_nightly
from orchestrator.progress import say
from orchestrator.sentinel import DEFAULT_BOUND, DEFAULT_RATIO


def build_parser() -> argparse.ArgumentParser:
    parser = common.ArgumentParser(prog="python -m orchestrator.cli.nightly", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget-s", type=common.budget_s, default=DEFAULT_BUDGET_S, help="calibration budget where one is needed"
    )
    parser.add_argument(
        "--lock",
        default=os.environ.get("AUTOTUNE_NIGHTLY_LOCK", DEFAULT_LOCK),
        help="name of the nightly's lock, held in the tracking server so every scheduler of "
        "this cluster sees it (default %(default)s)",
    )
    parser.add_argument("--max-model-age-days", type=common.age_days, default=7.0)
    parser.add_argument(
        "--sentinel-bound",
        type=common.number_in(0.0, 100.0),
        default=DEFAULT_BOUND,
        help="sentinel GMAE that marks a champion stale, at least (default %(default)s)",
    )
    parser.add_argument(
        "--sentinel-ratio",
        type=common.number_in(0.0, 1000.0),
        default=DEFAULT_RATIO,
        help="... or this many times its own held-out GMAE (default %(default)s)",
    )
    parser.add_argument("--seed", type=common.seed, default=0)
    common.add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    uri = registry.configure(args.tracking_uri)
    # The nightly's lock lives in the tracking server (every scheduler pod sees it) and expires
    # when its holder stops renewing it: a nightly that died or hangs cannot hold it past its run.
    lock = nightly_lease(args.lock, args.budget_s)
    if not lock.try_acquire():
        current = lock.current()
        who = current[0] if current else "unknown"
        say(f"another nightly run holds {args.lock} ({who}); exiting without doing anything")
        common.emit({"skipped": True, "lock": args.lock, "holder": who}, args.json, lambda _: None)
        return 0
    try:
        summary = run_nightly(
            lambda: common.fingerprint(args.ray_address, start_ray=True),
            uri,
            NightlySettings(
                args.budget_s, args.max_model_age_days, args.sentinel_bound, args.sentinel_ratio, args.seed
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

    common.emit(summary, args.json, human)
    return 0


main = common.entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

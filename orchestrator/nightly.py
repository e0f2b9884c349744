"""Nightly recalibration: check this cluster's champion, recalibrate only what is missing,
stale or drifting, and apply the promotion rule.

    python -m orchestrator.nightly [--budget-s S] [--lock PATH] [--ray-address A] [--tracking-uri U] [--json]

Per hardware of the Ray cluster: no champion, software (driver / CUDA / NCCL / torch / fbgemm)
changed, older than the age limit, launched jobs' prediction error drifting, or the sentinel
points re-measured off by more than their bound → a full calibration, registered as a
challenger and promoted only if not worse on the new held-out rows. Hardware ids that MLflow
has seen jobs for but holds no fresh champion of, and that are not in this cluster, are
listed: they need a nightly on their own hardware. Everything is printed and logged to an
MLflow run (kind=nightly).

Safe to start twice, on any pods: the first holds a lock kept in the tracking server
(`orchestrator.lease`, renewed while it runs, expiring when its holder stops); the second says
who holds it and exits 0 without touching anything.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

import mlflow

from orchestrator import registry
from orchestrator.calibrate import (
    DEFAULT_BUDGET_S, calibrate, describe, lock_timeout_s, print_summary, promotion_lease, waiting,
)
from orchestrator.lease import Lease
from orchestrator.cli_common import (
    ArgumentParser, add_common, age_days, budget_s, emit, fingerprint, number_in, run_main, seed,
)
from orchestrator.progress import say
from orchestrator.sentinel import DEFAULT_BOUND, DEFAULT_RATIO, run_sentinels

DEFAULT_LOCK = ".autotune/nightly.lock"


def hardware_seen_in_jobs() -> set[str]:
    runs = mlflow.search_runs(experiment_names=[registry.EXPERIMENT], filter_string="tags.kind = 'autotune'",
                              output_format="list", max_results=10_000)
    return {r.data.tags["hardware_id"] for r in runs if "hardware_id" in r.data.tags}


def check_hardware(fp, args: argparse.Namespace) -> dict[str, Any]:
    """Check one hardware's champion (sentinels included) and recalibrate it when needed."""
    hw = fp.hardware_id
    out: dict[str, Any] = {"hardware_id": hw, "recalibrated": False, "promoted": False}
    champion = registry.get_alias(hw, registry.CHAMPION)
    freshness = registry.check_freshness(champion, fp.software, args.max_model_age_days)
    reasons = list(freshness.reasons)
    if champion is not None:
        out["champion"] = f"{champion.name}/{champion.version}"
        say(f"{hw}: re-measuring the sentinels of champion v{champion.version}")
        report = run_sentinels(champion.model, fp.device_kind, hw, devices=sum(fp.devices_per_node),
                               bound=args.sentinel_bound, ratio=args.sentinel_ratio)
        out["sentinel"] = {k: v for k, v in report.to_dict().items() if k != "points"}
        mlflow.log_dict(report.to_dict(), f"sentinel-{hw}.json")
        mlflow.set_tag("checked_version", champion.version)
        if report.gmae is not None:
            mlflow.log_metrics({"sentinel_gmae": report.gmae, "sentinel_bound": report.bound,
                                "sentinel_points": float(len(report.points))})
            say(f"{hw}: sentinel GMAE {report.gmae:.1%} over {len(report.points)} point(s) "
                f"(stale above {report.bound:.1%}; the champion's held-out GMAE on those ops "
                + (f"{report.expected_gmae:.1%})" if report.expected_gmae is not None else "unknown)"))
        else:
            say(f"{hw}: no sentinel could be scored ({report.failures} failed, skipped ops {report.skipped})")
        if report.stale:
            reasons.append(f"sentinel drift: GMAE {report.gmae:.1%} > {report.bound:.1%}")
    out["reasons"] = reasons
    if not reasons:
        say(f"{hw}: champion v{champion.version} is fresh; nothing to do")
        return out
    say(f"{hw}: recalibrating: " + "; ".join(reasons))
    mlflow.set_tag("recalibration_reason", "; ".join(reasons))
    with promotion_lease(hw).hold(lock_timeout_s(args.budget_s), on_wait=waiting) as lease:
        latest = registry.get_alias(hw, registry.CHAMPION)
        if latest is not None and (champion is None or latest.version != champion.version):
            say(f"{hw}: another process promoted v{latest.version} meanwhile; nothing to recalibrate")
            out.update(reasons=reasons + [f"superseded by v{latest.version}"], champion=f"{latest.name}/{latest.version}")
            return out
        info = describe(calibrate(fp, args.budget_s, seed=args.seed, lease=lease))
    print_summary(info)
    out.update({"recalibrated": True, "promoted": info["promoted"], "model": info["model"],
                "promotion_reason": info["promotion_reason"]})
    return out


def nightly_lease(name: str, budget_s: float) -> Lease:
    """The nightly's own lock: renewed while it runs, for at most its calibration's wait and a
    calibration of every device kind it may find, and it expires `ttl_s` after its holder stops."""
    return Lease(f"nightly:{name}", max_hold_s=lock_timeout_s(budget_s) * 3)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m orchestrator.nightly", description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=budget_s, default=DEFAULT_BUDGET_S, help="calibration budget where one is needed")
    parser.add_argument("--lock", default=os.environ.get("AUTOTUNE_NIGHTLY_LOCK", DEFAULT_LOCK),
                        help="name of the nightly's lock, held in the tracking server so every scheduler of "
                             "this cluster sees it (default %(default)s)")
    parser.add_argument("--max-model-age-days", type=age_days, default=7.0)
    parser.add_argument("--sentinel-bound", type=number_in(0.0, 100.0), default=DEFAULT_BOUND,
                        help="sentinel GMAE that marks a champion stale, at least (default %(default)s)")
    parser.add_argument("--sentinel-ratio", type=number_in(0.0, 1000.0), default=DEFAULT_RATIO,
                        help="... or this many times its own held-out GMAE (default %(default)s)")
    parser.add_argument("--seed", type=seed, default=0)
    add_common(parser)
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
        emit({"skipped": True, "lock": args.lock, "holder": who}, args.json, lambda _: None)
        return 0
    try:
        t0 = time.monotonic()
        fp = fingerprint(args.ray_address, start_ray=True)
        say(f"nightly on {fp.hardware_id}: {fp.summary()}; MLflow at {uri}")
        with mlflow.start_run(run_name=f"nightly-{fp.hardware_id}") as run:
            mlflow.set_tags({"kind": "nightly", "hardware_id": fp.hardware_id})
            checked = [check_hardware(fp, args)]
            elsewhere = []
            for hw in sorted(hardware_seen_in_jobs() - {fp.hardware_id}):
                # Its software versions are unknown from here ({}): age, presence and job drift only.
                freshness = registry.check_freshness(registry.get_alias(hw, registry.CHAMPION), {}, args.max_model_age_days)
                if not freshness.fresh:
                    elsewhere.append({"hardware_id": hw, "reasons": freshness.reasons})
            summary = {"run_id": run.info.run_id, "tracking_uri": uri, "checked": checked,
                       "needs_nightly_on_its_own_hardware": elsewhere,
                       "recalibrated": sum(c["recalibrated"] for c in checked),
                       "promoted": sum(c["promoted"] for c in checked),
                       "wall_s": round(time.monotonic() - t0, 1)}
            mlflow.log_metrics({"recalibrated": float(summary["recalibrated"]), "promoted": float(summary["promoted"])})
            mlflow.log_dict(summary, "nightly_summary.json")
    finally:
        lock.release()

    def human(s: dict[str, Any]) -> None:
        for c in s["checked"]:
            what = (f"recalibrated → {c['model']} ({'promoted' if c['promoted'] else 'challenger'}: {c['promotion_reason']})"
                    if c["recalibrated"] else "fresh, nothing recalibrated")
            say(f"summary {c['hardware_id']}: {what}")
        for e in s["needs_nightly_on_its_own_hardware"]:
            say(f"summary {e['hardware_id']}: not in this cluster and " + "; ".join(e["reasons"]))
        say(f"nightly done in {s['wall_s']}s: {s['recalibrated']} recalibrated, {s['promoted']} promoted")

    emit(summary, args.json, human)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

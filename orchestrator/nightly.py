"""Nightly recalibration: check this cluster's champion, recalibrate only what is missing,
stale or drifting, and apply the promotion rule (the command is `python -m orchestrator.cli.nightly`).

Per hardware of the Ray cluster: no champion, software (driver / CUDA / NCCL / torch / fbgemm)
changed, older than the age limit, launched jobs' prediction error drifting, or the sentinel
points re-measured off the champion by more than their bound or running more than the speed
bound slower or faster than the calibration timed them → a full calibration, registered as a
challenger and promoted only if not worse on the new held-out rows. Hardware ids that MLflow
has seen jobs for but holds no fresh champion of, and that are not in this cluster, are
listed: they need a nightly on their own hardware. Everything is printed and logged to an
MLflow run (kind=nightly).

Safe to start twice, on any pods: the first holds a lock kept in the tracking server
(`orchestrator.lease`, renewed while it runs, expiring when its holder stops); the second says
who holds it and exits 0 without touching anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import mlflow

from orchestrator import calibrate as calibration
from orchestrator import registry
from orchestrator.cluster import HardwareFingerprint
from orchestrator.defaults import (
    DEFAULT_MODEL_AGE_DAYS,
    DEFAULT_SENTINEL_BOUND,
    DEFAULT_SENTINEL_RATIO,
    DEFAULT_SENTINEL_SPEED_BOUND,
)
from orchestrator.lease import Lease
from orchestrator.progress import say
from orchestrator.sentinel import run_sentinels


def hardware_seen_in_jobs() -> set[str]:
    runs = mlflow.search_runs(
        experiment_names=[registry.EXPERIMENT],
        filter_string="tags.kind = 'autotune'",
        output_format="list",
        max_results=10_000,
    )
    return {r.data.tags["hardware_id"] for r in runs if "hardware_id" in r.data.tags}


@dataclass(frozen=True)
class NightlySettings:
    """What a nightly run is told: its calibration budget, the model age limit, the sentinel
    bounds and the calibration's seed."""

    budget_s: float = calibration.DEFAULT_BUDGET_S
    max_model_age_days: float = DEFAULT_MODEL_AGE_DAYS
    sentinel_bound: float = DEFAULT_SENTINEL_BOUND
    sentinel_ratio: float = DEFAULT_SENTINEL_RATIO
    seed: int = 0
    sentinel_speed_bound: float | None = DEFAULT_SENTINEL_SPEED_BOUND


def check_hardware(fp: HardwareFingerprint, settings: NightlySettings) -> dict[str, Any]:
    """Check one hardware's champion (sentinels included) and recalibrate it when needed."""
    hw = fp.hardware_id
    out: dict[str, Any] = {"hardware_id": hw, "recalibrated": False, "promoted": False}
    champion = registry.get_alias(hw, registry.CHAMPION)
    freshness = registry.check_freshness(champion, fp.software, settings.max_model_age_days)
    reasons = list(freshness.reasons)
    if champion is not None:
        out["champion"] = f"{champion.name}/{champion.version}"
        say(f"{hw}: re-measuring the sentinels of champion v{champion.version}")
        report = run_sentinels(
            champion.model,
            fp.device_kind,
            hw,
            devices=sum(fp.devices_per_node),
            bound=settings.sentinel_bound,
            ratio=settings.sentinel_ratio,
            speed_bound=settings.sentinel_speed_bound,
        )
        out["sentinel"] = {k: v for k, v in report.to_dict().items() if k != "points"}
        mlflow.log_dict(report.to_dict(), f"sentinel-{hw}.json")
        mlflow.set_tag("checked_version", champion.version)
        if report.speed is not None:
            mlflow.log_metric("sentinel_speed", report.speed)
        if report.gmae is not None:
            mlflow.log_metrics(
                {
                    "sentinel_gmae": report.gmae,
                    "sentinel_bound": report.bound,
                    "sentinel_points": float(len(report.points)),
                    **({"sentinel_ratio": report.ratio} if report.ratio is not None else {}),
                }
            )
            direction = f", measured / predicted {report.ratio:.2f}" if report.ratio is not None else ""
            say(
                f"{hw}: sentinel GMAE {report.gmae:.1%} over {len(report.points)} point(s){direction} "
                f"(stale above {report.bound:.1%}; the champion's held-out GMAE on those ops "
                + (f"{report.expected_gmae:.1%})" if report.expected_gmae is not None else "unknown)")
            )
        else:
            say(f"{hw}: no sentinel could be scored ({report.failures} failed, skipped ops {report.skipped})")
        if report.speed is not None:
            say(
                f"{hw}: sentinels run {report.speed:.3f}x their calibration times over {report.speed_points} "
                f"point(s), {report.speed_same_way:.0%} of them that way ("
                + (
                    f"drift past {report.speed_bound:.2f}x either way)"
                    if report.speed_bound
                    else "reported, not judged)"
                )
            )
        if report.stale:
            reasons += report.reasons
    out["reasons"] = reasons
    if not reasons:
        say(f"{hw}: champion v{champion.version} is fresh; nothing to do")
        return out
    say(f"{hw}: recalibrating: " + "; ".join(reasons))
    mlflow.set_tag("recalibration_reason", "; ".join(reasons))
    with calibration.promotion_lease(hw).hold(
        calibration.lock_timeout_s(settings.budget_s), on_wait=calibration.waiting
    ) as lease:
        latest = registry.get_alias(hw, registry.CHAMPION)
        if latest is not None and (champion is None or latest.version != champion.version):
            say(f"{hw}: another process promoted v{latest.version} meanwhile; nothing to recalibrate")
            out.update(
                reasons=reasons + [f"superseded by v{latest.version}"], champion=f"{latest.name}/{latest.version}"
            )
            return out
        with calibration.calibration_run(hw) as calibrating:
            info = calibration.describe(
                calibration.calibrate(fp, calibration.CalibrationRequest(settings.budget_s, seed=settings.seed), lease)
            )
        info["run_id"] = calibrating.info.run_id
    calibration.print_summary(info)
    out.update(
        {
            "recalibrated": True,
            "promoted": info["promoted"],
            "model": info["model"],
            "promotion_reason": info["promotion_reason"],
        }
    )
    return out


def nightly_lease(name: str, budget_s: float) -> Lease:
    """The nightly's own lock: renewed while it runs, for at most its calibration's wait and a
    calibration of every device kind it may find, and it expires `ttl_s` after its holder stops."""
    return Lease(f"nightly:{name}", max_hold_s=calibration.lock_timeout_s(budget_s) * 3)


def run_nightly(fingerprint: Callable[[], HardwareFingerprint], uri: str, settings: NightlySettings) -> dict[str, Any]:
    """The nightly, once its lease is held: fingerprint the cluster, check (and recalibrate where
    needed) its hardware inside an MLflow run (kind=nightly), list the hardware seen in jobs that
    needs a nightly on its own machines; returns the summary logged."""
    t0 = time.monotonic()
    fp = fingerprint()
    say(f"nightly on {fp.hardware_id}: {fp.summary()}; MLflow at {uri}")
    with mlflow.start_run(run_name=f"nightly-{fp.hardware_id}") as run:
        mlflow.set_tags({"kind": "nightly", "hardware_id": fp.hardware_id})
        checked = [check_hardware(fp, settings)]
        elsewhere = []
        for hw in sorted(hardware_seen_in_jobs() - {fp.hardware_id}):
            # Its software versions are unknown from here ({}): age, presence and job drift only.
            freshness = registry.check_freshness(
                registry.get_alias(hw, registry.CHAMPION), {}, settings.max_model_age_days
            )
            if not freshness.fresh:
                elsewhere.append({"hardware_id": hw, "reasons": freshness.reasons})
        summary = {
            "run_id": run.info.run_id,
            "tracking_uri": uri,
            "checked": checked,
            "needs_nightly_on_its_own_hardware": elsewhere,
            "recalibrated": sum(c["recalibrated"] for c in checked),
            "promoted": sum(c["promoted"] for c in checked),
            "wall_s": round(time.monotonic() - t0, 1),
        }
        mlflow.log_metrics({"recalibrated": float(summary["recalibrated"]), "promoted": float(summary["promoted"])})
        mlflow.log_dict(summary, "nightly_summary.json")
    return summary

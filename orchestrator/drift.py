"""Prediction drift and model drift per hardware and model version, with a chart (the command
is `python -m orchestrator.cli.drift`).

Prediction drift: every launched job (an autotune run) logged its predicted and measured
iteration time and the model version it planned with; per (hardware_id, version) this reports
the rolling geomean error over the last N jobs and its trend (the newer half of those jobs
against the older half). Model drift: every nightly run logged the champion's sentinel error;
the chart shows both over time, one line per model version, and is logged to MLflow.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlflow

from orchestrator import registry
from orchestrator.calibration_plots import pyplot
from predictors.evaluation import geomean

RISING, FALLING = 1.25, 0.8  # newer-half / older-half geomean ratios that count as a trend


@dataclass
class VersionDrift:
    version: str
    jobs: int
    rolling_geomean_error: float
    trend: str  # rising | flat | falling | too few jobs
    trend_ratio: float | None
    errors: list[dict[str, Any]] = field(default_factory=list)  # time (ms since epoch), error, job


def _trend(errors: list[float]) -> tuple[str, float | None]:
    if len(errors) < 4:
        return "too few jobs", None
    half = len(errors) // 2
    ratio = geomean(errors[half:]) / geomean(errors[:half])
    return ("rising" if ratio > RISING else "falling" if ratio < FALLING else "flat"), ratio


def _runs(kind: str, hardware_id: str | None, metric: str) -> list[Any]:
    filters = [f"tags.kind = '{kind}'", f"metrics.{metric} >= 0"]
    if hardware_id:
        filters.append(f"tags.hardware_id = '{hardware_id}'")
    return mlflow.search_runs(
        experiment_names=[registry.EXPERIMENT],
        filter_string=" and ".join(filters),
        order_by=["attributes.start_time ASC"],
        output_format="list",
        max_results=10_000,
    )


def collect(hardware_id: str | None = None, last: int = 10) -> dict[str, Any]:
    """Per hardware_id: per model version the prediction drift, and the sentinel history."""
    jobs: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in _runs("autotune", hardware_id, "prediction_error"):
        tags = run.data.tags
        jobs[tags.get("hardware_id", "?")][tags.get("model_version", "?")].append(
            {
                "time": run.info.start_time,
                "error": run.data.metrics["prediction_error"],
                "job": tags.get("job_name", ""),
            }
        )
    sentinels: dict[str, list] = defaultdict(list)
    for run in _runs("nightly", hardware_id, "sentinel_gmae"):
        tags = run.data.tags
        sentinels[tags.get("hardware_id", "?")].append(
            {
                "time": run.info.start_time,
                "gmae": run.data.metrics["sentinel_gmae"],
                "bound": run.data.metrics.get("sentinel_bound"),
                "version": tags.get("checked_version", "?"),
            }
        )
    report: dict[str, Any] = {}
    for hw in sorted(set(jobs) | set(sentinels)):
        versions = []
        for version, rows in sorted(jobs[hw].items(), key=lambda kv: kv[1][0]["time"]):
            recent = [r["error"] for r in rows[-last:]]
            trend, ratio = _trend(recent)
            versions.append(asdict(VersionDrift(version, len(rows), geomean(recent), trend, ratio, rows)))
        report[hw] = {"versions": versions, "sentinel": sentinels[hw]}
    return report


def chart(hardware_id: str, data: dict[str, Any]) -> Any:
    """Prediction error per job (one line per model version) above sentinel error per nightly."""
    from datetime import datetime

    import matplotlib.dates as mdates

    plt = pyplot()

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for v in data["versions"]:
        times = [datetime.fromtimestamp(e["time"] / 1000) for e in v["errors"]]
        top.plot(times, [100 * e["error"] for e in v["errors"]], marker="o", label=f"v{v['version']}")
    top.set_ylabel("prediction error (%)")
    top.set_title(f"drift on {hardware_id}")
    if data["versions"]:
        top.legend(title="model version")
    else:
        top.text(0.5, 0.5, "no launched jobs yet", ha="center", va="center", transform=top.transAxes)
    by_version: dict[str, list] = defaultdict(list)
    for s in data["sentinel"]:
        by_version[s["version"]].append(s)
    for version, rows in by_version.items():
        bottom.plot(
            [datetime.fromtimestamp(s["time"] / 1000) for s in rows],
            [100 * s["gmae"] for s in rows],
            marker="s",
            label=f"v{version}",
        )
    bounds = [(datetime.fromtimestamp(s["time"] / 1000), 100 * s["bound"]) for s in data["sentinel"] if s["bound"]]
    if bounds:
        bottom.plot(*zip(*bounds), linestyle="--", color="grey", label="stale above")
    if by_version:
        bottom.legend(title="champion checked")
    bottom.set_ylabel("sentinel GMAE (%)")
    if not by_version:
        bottom.text(0.5, 0.5, "no nightly checks yet", ha="center", va="center", transform=bottom.transAxes)
    locator = mdates.AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    return fig


def report(hardware_id: str | None, last: int, out_dir: Path) -> dict[str, Any]:
    """Collect the drift of every hardware (or one), chart each, and log charts and numbers to an
    MLflow run (kind=drift): {"hardware": per hardware its versions and sentinels, "charts": paths}."""
    hardware = collect(hardware_id, last)
    charts = {}
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    with mlflow.start_run(run_name="drift"):
        mlflow.set_tags({"kind": "drift", **({"hardware_id": hardware_id} if hardware_id else {})})
        for hw, data in hardware.items():
            fig = chart(hw, data)
            charts[hw] = str(out_dir / f"drift-{hw}.png")
            fig.savefig(charts[hw], dpi=100)  # the local copy --out-dir asks for
            mlflow.log_figure(fig, f"charts/drift-{hw}.png")
            plt.close(fig)
            for v in hardware[hw]["versions"]:
                mlflow.log_metric(f"rolling_error.{hw}.v{v['version']}", v["rolling_geomean_error"])
        mlflow.log_dict(hardware, "drift.json")
    return {"hardware": hardware, "charts": charts}

"""The earlier calibrations of a hardware as MLflow keeps them (each calibration run's
measurement table and fingerprint), for a new calibration's step fit to pool their whole
steps with its own (`predictors.step_pool`, which decides which of them measured this
machine). MLflow, not the calibration directories: on a cluster the driver's home may be a
fresh pod's, the tracking server is the memory every calibration reached."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException

from orchestrator import registry
from predictors.step_pool import EARLIER_CALIBRATIONS, EarlierCalibration
from probes.vocabulary.records import frame_to_measurements

CALIBRATION_TAG = "calibration"  # the calibration directory's name a run's rows came from
MEASUREMENTS_ARTIFACT = "measurements.parquet"  # `registry.log_measurements`
FINGERPRINT_ARTIFACT = "fingerprint.json"  # `calibrate.calibrate`
SEARCHED_RUNS = 100  # newest calibration runs of the hardware looked through


def calibration_identity(run: Any) -> str:
    """Which calibration's rows a run logged: a refit logs another run's (its `refit_of`
    directory), so the two are one calibration, pooled once."""
    tags = run.data.tags
    if tags.get(CALIBRATION_TAG):
        return str(tags[CALIBRATION_TAG])
    if tags.get("refit_of"):
        return Path(tags["refit_of"]).name
    return str(run.info.run_id)


def read_calibration(run_id: str) -> tuple[list, dict[str, str]] | None:
    """A calibration run's measurements and software, None when it logged no table (it failed
    before fitting)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            table = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=MEASUREMENTS_ARTIFACT, dst_path=tmp
            )
        except (MlflowException, OSError):
            return None
        rows = frame_to_measurements(pd.read_parquet(table))
        try:
            fingerprint = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=FINGERPRINT_ARTIFACT, dst_path=tmp
            )
            software = dict(json.loads(Path(fingerprint).read_text()).get("software") or {})
        except (MlflowException, OSError, ValueError):
            software = {}  # unknown software is never the same software: its steps are not pooled
    return rows, software


def earlier_calibrations(
    hardware_id: str, calibration: str, count: int = EARLIER_CALIBRATIONS
) -> list[EarlierCalibration]:
    """The newest `count` calibrations of `hardware_id` in the tracking store other than
    `calibration` (this one's directory name) and the active run, each once."""
    runs = mlflow.search_runs(
        experiment_names=[registry.EXPERIMENT],
        filter_string=f"tags.kind = 'calibration' and tags.hardware_id = '{hardware_id}'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
        max_results=SEARCHED_RUNS,
    )
    active = mlflow.active_run()
    seen, found = {calibration}, []
    for run in runs:
        identity = calibration_identity(run)
        if identity in seen or (active is not None and run.info.run_id == active.info.run_id):
            continue
        stored = read_calibration(run.info.run_id)
        if stored is None:
            continue
        seen.add(identity)
        found.append(EarlierCalibration(f"{identity} (run {run.info.run_id})", *stored))
        if len(found) == count:
            break
    return found

"""The e2e benchmark's checks on the calibration's own steps: which steps, and what a check says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import benchmarks.step_checks as step_checks
from benchmarks.step_checks import StepChecks, summary, table_wise_task_steps
from orchestrator.measurement_store import MeasurementStore
from probes.vocabulary.ops import DLRM_STEP_OP
from probes.vocabulary.records import Measurement


def step(name: str, batch: int, plan: list, seconds: float = 0.01) -> Measurement:
    tables = [
        {"name": f"t{j}", "num_embeddings": 1000, "embedding_dim": 8, "pooling_factor": 2, "distribution": "uniform"}
        for j in range(len(plan))
    ]
    job = {
        "name": name,
        "workload": "dlrm",
        "world_size": 2,
        "batch_size": batch,
        "seed": 0,
        "dense": {"num_dense_features": 4, "bottom_mlp": [8], "top_mlp": [1]},
        "tables": tables,
    }
    return Measurement(DLRM_STEP_OP, {"job": job, "table_to_rank": plan}, seconds, 0.0, 30, world_size=2)


def calibration(tmp_path: Path) -> Path:
    MeasurementStore(tmp_path).add(
        [
            step("overhead0", 64, [0, 1]),
            step("task1", 128, [0, 1]),
            step("light2", 16, [1, 1]),
            step("task3", 256, [0, {"type": "row_wise"}]),  # a mixed plan: not what the e2e tasks run
            step("task5", 1024, [1, 0]),
            step("task7", 512, [0, 0]),
            step("task9", 256, [0, 1]),
        ]
    )
    return tmp_path


def test_only_table_wise_task_steps_are_picked_spread_over_batches(tmp_path: Path):
    directory = calibration(tmp_path)
    every = table_wise_task_steps(directory, 10)
    assert [s.params["job"]["name"] for s in every] == ["task1", "task9", "task7", "task5"]  # by batch
    assert [s.params["job"]["name"] for s in table_wise_task_steps(directory, 2)] == ["task1", "task7"]


def test_a_calibration_without_task_steps_is_refused(tmp_path: Path):
    MeasurementStore(tmp_path).add([step("overhead0", 64, [0, 1])])
    with pytest.raises(ValueError, match="task"):
        table_wise_task_steps(tmp_path, 4)


def test_a_check_reads_the_spell_and_the_champions_error_on_its_own_steps(tmp_path: Path, monkeypatch):
    directory = calibration(tmp_path)
    checks = StepChecks(directory, 2, model=None, hardware_id="h")  # type: ignore[arg-type]
    monkeypatch.setattr(checks, "_time", lambda steps: [1.25 * s.median_s for s in steps])  # a slow spell
    monkeypatch.setattr(step_checks, "estimate_step", lambda *a, **k: SimpleNamespace(iteration_s=0.01))
    checks("before round 1")
    result = checks.result()
    (check,) = result["step_checks"]
    assert check["label"] == "before round 1" and len(check["steps"]) == 2
    assert result["own_steps_now_over_stored"] == pytest.approx(1.25)
    assert check["signed_stored"] == pytest.approx(0.0)  # priced at their stored times
    assert result["own_steps_signed"] == pytest.approx(1 / 1.25 - 1)  # leaning low on the slow spell


def test_without_a_calibration_or_with_none_asked_no_check_runs(tmp_path: Path):
    for checks in (StepChecks(None, 4, None, "h"), StepChecks(calibration(tmp_path), 0, None, "h")):  # type: ignore[arg-type]
        checks("before round 1")
        assert checks.result() == {"step_checks": [], "own_steps_now_over_stored": None, "own_steps_signed": None}


def test_summary_is_a_geomean_of_ratios_and_mean_signed_errors():
    rows = [
        {"stored_ms": 10.0, "now_ms": 20.0, "predicted_ms": 10.0},
        {"stored_ms": 10.0, "now_ms": 5.0, "predicted_ms": 10.0},
    ]
    figures = summary(rows)
    assert figures["now_over_stored"] == pytest.approx(1.0)
    assert figures["signed_now"] == pytest.approx((-0.5 + 1.0) / 2)
    assert figures["signed_stored"] == pytest.approx(0.0)

"""The e2e benchmarks' checks on the calibration's own steps: which steps, and what a check says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from benchmarks.step_checks import OWN_STEPS, StepChecks, own_steps, summary
from orchestrator.measurement_store import MeasurementStore
from probes.vocabulary.ops import DLRM_STEP_OP, TRANSFORMER_STEP_OP
from probes.vocabulary.records import Measurement
from probes.vocabulary.transformer_spec import random_transformer


def dlrm_step(name: str, batch: int, plan: list, seconds: float) -> Measurement:
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


def transformer_step(index: int, seconds: float, **layout) -> Measurement:
    spec = random_transformer(index, 2, layout.pop("tensor_parallel", 1), 0).to_dict() | layout
    return Measurement(TRANSFORMER_STEP_OP, {"transformer": spec}, seconds, 0.0, 30, world_size=2)


def calibration(tmp_path: Path) -> Path:
    MeasurementStore(tmp_path).add(
        [
            dlrm_step("overhead0", 64, [0, 1], 0.002),
            dlrm_step("task1", 128, [0, 1], 0.010),
            dlrm_step("light2", 16, [1, 1], 0.003),
            dlrm_step("task3", 256, [0, {"type": "row_wise"}], 0.020),  # a mixed plan: not what the e2e tasks run
            dlrm_step("task5", 1024, [1, 0], 0.050),
            dlrm_step("task7", 512, [0, 0], 0.030),
            dlrm_step("task9", 256, [0, 1], 0.015),
            transformer_step(0, 0.020),
            transformer_step(1, 0.010, tensor_parallel=2),  # not data parallel
            transformer_step(2, 0.030, fsdp="full_shard"),
            transformer_step(3, 0.040, dtype="bfloat16"),
            transformer_step(4, 0.005),
        ]
    )
    return tmp_path


def names(rows: list[Measurement], workload: str) -> list[str]:
    return [OWN_STEPS[workload].name(r) for r in rows]


def test_only_steps_like_the_runs_tasks_are_picked_spread_over_their_sizes(tmp_path: Path):
    directory = calibration(tmp_path)
    assert names(own_steps(directory, "dlrm"), "dlrm") == ["task1", "task9", "task7", "task5"]  # table-wise, by time
    assert names(own_steps(directory, "dlrm", 2), "dlrm") == ["task1", "task5"]  # the shortest and the longest
    assert names(own_steps(directory, "dlrm", 3), "dlrm") == ["task1", "task7", "task5"]
    assert names(own_steps(directory, "dlrm", 1), "dlrm") == ["task7"]  # the middle one
    dp = own_steps(directory, "transformer")  # data parallel in float32: the transformer benchmark's tasks
    assert [r.median_s for r in dp] == [0.005, 0.020]


def test_a_step_timed_again_after_a_failure_is_picked_once(tmp_path: Path):
    MeasurementStore(tmp_path).add([dlrm_step("task1", 128, [0, 1], 0.010), dlrm_step("task1", 128, [0, 1], 0.012)])
    (step,) = own_steps(tmp_path, "dlrm")
    assert step.median_s == 0.012


def test_a_calibration_without_such_steps_is_refused_before_any_check(tmp_path: Path):
    MeasurementStore(tmp_path).add([dlrm_step("overhead0", 64, [0, 1], 0.002)])
    with pytest.raises(ValueError, match="dlrm"):
        StepChecks(tmp_path, "dlrm", 4, None, "h")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transformer"):
        own_steps(tmp_path, "transformer")


def test_a_failed_check_is_recorded_and_left_out_of_the_medians(tmp_path: Path, monkeypatch):
    checks = StepChecks(calibration(tmp_path), "dlrm", 2, model=None, hardware_id="h")  # type: ignore[arg-type]
    monkeypatch.setattr(checks, "kind", dataclasses.replace(checks.kind, price_s=lambda model, row: row.median_s))

    def gang_cannot_form(steps):
        raise RuntimeError("could not reserve 2 x {'CPU': 1}")

    monkeypatch.setattr(checks, "_time", gang_cannot_form)
    checks("before round 1")
    monkeypatch.setattr(checks, "_time", lambda steps: [2.0 * s.median_s for s in steps])
    checks("after round 1")
    result = checks.result()
    assert [c["label"] for c in result["step_checks"]] == ["before round 1", "after round 1"]
    assert "could not reserve" in result["step_checks"][0]["error"]
    assert result["own_steps_now_over_stored"] == pytest.approx(2.0)  # the failed check counts for nothing


@pytest.mark.parametrize("workload", ["dlrm", "transformer"])
def test_a_check_reads_the_spell_and_the_champions_error_on_its_own_steps(tmp_path: Path, monkeypatch, workload):
    directory = calibration(tmp_path)
    checks = StepChecks(directory, workload, 2, model=None, hardware_id="h")  # type: ignore[arg-type]
    monkeypatch.setattr(checks, "_time", lambda steps: [1.25 * s.median_s for s in steps])  # a slow spell
    priced = dataclasses.replace(OWN_STEPS[workload], price_s=lambda model, row: row.median_s)
    monkeypatch.setattr(checks, "kind", priced)  # the champion prices each step at its stored time
    checks("before round 1")
    result = checks.result()
    (check,) = result["step_checks"]
    assert check["label"] == "before round 1" and len(check["steps"]) == 2
    assert result["own_steps_now_over_stored"] == pytest.approx(1.25)
    assert result["own_steps_signed"] == pytest.approx(1 / 1.25 - 1)  # leaning low on the slow spell


def test_a_probe_reruns_each_step_with_what_the_calibration_ran(tmp_path: Path):
    directory = calibration(tmp_path)
    (dlrm,) = own_steps(directory, "dlrm", 1)
    assert OWN_STEPS["dlrm"].probe_params(dlrm) == {"job": dlrm.params["job"], "table_to_rank": [0, 0]}
    (transformer,) = own_steps(directory, "transformer", 1)
    assert OWN_STEPS["transformer"].probe_params(transformer) == {"transformer": transformer.params["transformer"]}


def test_without_a_calibration_or_with_none_asked_no_check_runs(tmp_path: Path):
    directory = calibration(tmp_path)
    for checks in (StepChecks(None, "dlrm", 4, None, "h"), StepChecks(directory, "dlrm", 0, None, "h")):  # type: ignore[arg-type]
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

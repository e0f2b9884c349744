"""The end-to-end benchmarks' host speed checks: when they run, and what one measures."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.e2e_accuracy import (
    HostChecks,
    add_host_check_arguments,
    champions_calibration,
    check_host_check_argument,
    make_checks,
    measure_in_rounds,
)
from benchmarks.host_drift import host_speed, remeasure, stored_rows
from orchestrator.measurement_store import MeasurementStore
from orchestrator.sentinel import BASELINE_DIRECTORY, calibration_baseline
from probes.embedding import embedding_specs
from probes.gemm import gemm_specs
from probes.sweep import run_local_probe


def test_checks_run_before_the_first_round_and_after_each():
    events: list[str] = []

    def launch(i: int) -> float:
        events.append(f"task {i}")
        return 1.0

    measure_in_rounds(["a", "b"], 2, launch, events.append)
    assert events == ["before round 1", "task 0", "task 1", "after round 1", "task 1", "task 0", "after round 2"]


def test_a_check_measures_the_calibrations_own_points_again(tmp_path: Path):
    store = MeasurementStore(tmp_path)
    for spec in gemm_specs(4, seed=0, max_dim=1024):
        store.add(run_local_probe(spec))
    stored = len(stored_rows(tmp_path))
    assert stored >= 1
    checks = HostChecks(tmp_path, points=2)
    checks("before round 1")
    result = checks.result()
    (check,) = result["host_checks"]
    assert check["label"] == "before round 1" and check["all"]["n"] == min(2, stored)
    assert result["host_speed"]["before round 1"] == check["all"]["geomean_ratio"] > 0


def test_without_a_calibration_no_check_runs():
    checks = HostChecks(None, points=2)
    checks("before round 1")
    assert checks.result()["host_speed"] == {} and checks.result()["host_checks"] == []


def test_a_calibration_without_kernel_points_is_refused(tmp_path: Path):
    MeasurementStore(tmp_path).sync()
    with pytest.raises(ValueError, match="gemm"):
        host_speed(tmp_path, points=2)


def test_a_host_check_that_is_not_a_calibration_is_refused_before_anything_runs(tmp_path: Path, capsys):
    parser = argparse.ArgumentParser()
    add_host_check_arguments(parser)
    args = parser.parse_args(["--host-check", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        check_host_check_argument(parser, args)
    assert exited.value.code == 2 and "--host-check: no measurements.jsonl" in capsys.readouterr().err
    (tmp_path / "measurements.jsonl").write_text("")
    check_host_check_argument(parser, args)  # a calibration's directory passes


def _calibration_with_sentinels(directory: Path, seed: int) -> Path:
    """A calibration directory whose sentinel pass timed two GEMMs (drawn from `seed`)."""
    MeasurementStore(directory).sync()
    sentinels = MeasurementStore(directory / BASELINE_DIRECTORY / "pass0")
    for spec in gemm_specs(2, seed=seed, max_dim=256):
        sentinels.add(run_local_probe(spec))
    sentinels.sync()
    return directory


def test_a_host_check_of_another_calibration_than_the_champions_is_refused(tmp_path: Path, capsys):
    """The champion keeps its calibration's sentinel times: a --host-check directory with other
    times is another calibration's, and its checks would read the spell against the wrong one."""
    own = _calibration_with_sentinels(tmp_path / "own", seed=0)
    other = _calibration_with_sentinels(tmp_path / "other", seed=1)
    champion = SimpleNamespace(meta={"sentinel_baseline": calibration_baseline(own)})
    assert champions_calibration(own, champion) is None
    why = champions_calibration(other, champion)
    assert why is not None and str(other) in why and "not the champion's calibration" in why
    # the same points timed again (a second calibration of the same seed) are another calibration's too
    again = _calibration_with_sentinels(tmp_path / "again", seed=0)
    assert calibration_baseline(again).keys() == calibration_baseline(own).keys()
    why = champions_calibration(again, champion)
    shared = len(calibration_baseline(own))
    assert why is not None and f"{shared} of {shared} points in common" in why
    args = SimpleNamespace(host_check_points=2, step_checks=0)
    with pytest.raises(SystemExit) as exited:
        make_checks(other, args, "dlrm", champion, "hw")
    assert exited.value.code == 2 and "--host-check" in capsys.readouterr().err
    # a bundle or a calibration without sentinel times cannot be told apart: no refusal
    assert champions_calibration(other, SimpleNamespace(meta={})) is None
    bare = tmp_path / "bare"
    MeasurementStore(bare).sync()
    assert champions_calibration(bare, champion) is None


def test_an_embedding_row_is_measured_again_from_what_it_stored(tmp_path: Path):
    """A DLRM step spends its time in lookups: the check re-runs the calibration's embedding
    rows too, from the tables and batch a row keeps (its distributions stored as labels)."""
    store = MeasurementStore(tmp_path)
    spec = next(
        s
        for s in embedding_specs(40, seed=0, max_rows=20_000, max_batch=256)
        if any(isinstance(t[3], dict) for t in s.params["tables"])
    )  # a Zipf or profile table: labelled, not a spec
    store.add(run_local_probe(spec))
    rows = [r for r in stored_rows(tmp_path) if r.family == "embedding"]
    assert {r.op for r in rows} <= {"embedding_fwd", "embedding_bwd"} and rows
    again = remeasure(rows)
    assert [family for family, _ in again] == ["embedding"] * len(rows) and all(r > 0 for _, r in again)


def test_a_check_waits_for_a_quiet_host_first_and_records_the_wait(tmp_path: Path):
    from orchestrator.quiet_host import QuietWait

    store = MeasurementStore(tmp_path)
    for spec in gemm_specs(2, seed=0, max_dim=256):
        store.add(run_local_probe(spec))
    waits: list[str] = []

    def wait() -> QuietWait:
        waits.append("waited")
        return QuietWait(waited_s=3.5, busy_share=0.6, quiet=False)

    checks = HostChecks(tmp_path, points=1, wait=wait)
    checks("before round 1")
    checks("after round 1")
    first, second = checks.result()["host_checks"]
    assert waits == ["waited", "waited"]  # one wait per check
    assert first["quiet_wait_s"] == 3.5 and first["host_quiet"] is False and second["label"] == "after round 1"

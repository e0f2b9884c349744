"""Model drift (sentinels), prediction drift (the drift report and chart), the nightly's lock."""

from __future__ import annotations

import copy
import json

import mlflow
import numpy as np
import pytest

from orchestrator import nightly, registry
from orchestrator.cli import drift as drift_cli
from orchestrator.cli import nightly as nightly_cli
from orchestrator.drill import DRILL_ENV, apply_drill, drill_slowdown
from orchestrator.sentinel import baseline_times, choose_sentinels, confirmed, score_sentinels
from predictors import fit_performance_model
from predictors.performance_model import PerformanceModel
from probes.gemm import gemm_specs
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement


def gemm_rows(n: int, seed: int, slowdown: float = 1.0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m, nn, k = (int(x) for x in rng.integers(8, 1024, size=3))
        p = gemm_params(m, nn, k)
        t = (3e-6 + p["flops"] / 3e10) * slowdown * (1 + 0.03 * rng.standard_normal())
        out.append(Measurement("gemm", p, abs(t), 0.0, 5))
    return out


@pytest.fixture(scope="module")
def model():
    fitted, _ = fit_performance_model(gemm_rows(80, 0), "cpu-test")
    return fitted


def test_sentinels_within_the_models_error_are_fresh_and_a_slower_machine_is_stale(model):
    fresh = score_sentinels(model, gemm_rows(12, 1))
    assert fresh.gmae is not None and fresh.gmae < 0.1 and not fresh.stale
    assert fresh.bound == pytest.approx(max(0.35, 2 * fresh.expected_gmae))
    slow = score_sentinels(model, gemm_rows(12, 1, slowdown=3.0))
    assert slow.gmae > 0.6 and slow.stale
    # The ratio says which way: the same points three times slower read three times the ratio.
    assert slow.ratio == pytest.approx(3.0 * fresh.ratio, rel=0.05) and 0.8 < fresh.ratio < 1.25
    fast = score_sentinels(model, gemm_rows(12, 1, slowdown=1 / 3))
    assert fast.stale and fast.ratio < 0.5
    # Ops the champion cannot price are reported, not scored as zero error.
    other = score_sentinels(model, [Measurement("softmax", {"rows": 4, "cols": 4}, 1e-5, 0.0, 5)])
    assert other.gmae is None and not other.stale and other.skipped == ["softmax"]


def test_one_stale_pass_is_drift_only_when_its_re_measurement_is_stale_too(model):
    spell = score_sentinels(model, gemm_rows(12, 1, slowdown=3.0), failures=1)
    settled = confirmed(spell, score_sentinels(model, gemm_rows(12, 2)))
    assert spell.stale and not settled.stale and settled.failures == 1
    assert settled.passes == [spell.gmae, settled.gmae] and settled.gmae < 0.1
    slower = confirmed(spell, score_sentinels(model, gemm_rows(12, 2, slowdown=3.0)))
    assert slower.stale and slower.gmae > 0.6 and len(slower.passes) == 2


def test_sentinels_slower_than_the_calibration_timed_them_are_drift_however_close_to_the_model(model):
    calibrated = PerformanceModel.from_dict(copy.deepcopy(model.to_dict()))
    calibrated.meta["sentinel_baseline"] = baseline_times(gemm_rows(12, 1))  # the calibration's own times
    slower = score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1.2), speed_bound=1.1)
    assert slower.gmae is not None and slower.gmae < slower.bound  # near the model: the GMAE bound passes it
    assert slower.speed == pytest.approx(1.2) and slower.speed_points == 12 and slower.speed_same_way == 1.0
    assert slower.stale and slower.reasons == [
        "speed drift: sentinels run 1.20x their calibration times over 12 point(s) (bound 1.10x either way)"
    ]
    # Without a bound (the default) the speed is reported, never acted on.
    reported = score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1.2))
    assert reported.speed == pytest.approx(1.2) and not reported.stale and reported.speed_bound is None
    faster = score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1 / 1.2), speed_bound=1.1)
    assert faster.stale and faster.speed == pytest.approx(1 / 1.2)
    assert not score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1.05), speed_bound=1.1).stale
    assert score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1.05), speed_bound=1.04).stale
    # Noise moves points both ways: a geomean past the bound carried by a few points is not drift.
    mixed = gemm_rows(12, 1)
    for i, row in enumerate(mixed):
        row.median_s *= 1.5 if i < 7 else 0.95
    spread = score_sentinels(calibrated, mixed, speed_bound=1.1)
    assert spread.speed is not None and spread.speed > 1.2 and spread.speed_same_way < 0.75
    assert not any(r.startswith("speed drift") for r in spread.reasons)
    # A bundle without the calibration's times has no speed to judge, nor do points it did not time.
    assert score_sentinels(model, gemm_rows(12, 1, slowdown=1.2), speed_bound=1.1).speed is None
    other = score_sentinels(calibrated, gemm_rows(12, 5, slowdown=1.2), speed_bound=1.1)
    assert other.speed is None and other.speed_points == 0 and not other.stale
    # One slow pass is confirmed by a second or dropped, as for the GMAE.
    settled = confirmed(slower, score_sentinels(calibrated, gemm_rows(12, 1), speed_bound=1.1))
    assert not settled.stale and settled.reasons == [] and settled.speed == pytest.approx(1.0)
    assert confirmed(slower, slower).reasons == slower.reasons
    # Each test must fail twice: a pass far off the model, then one only slower, is no drift.
    off_model = score_sentinels(calibrated, gemm_rows(12, 1, slowdown=3.0), speed_bound=100)
    assert off_model.reasons[0].startswith("sentinel drift") and len(off_model.reasons) == 1
    assert not confirmed(off_model, slower).stale
    # Three common points are too few to call a speed (one always "moved the same way").
    few = score_sentinels(calibrated, gemm_rows(12, 1, slowdown=1.2)[:3], speed_bound=1.1)
    assert few.speed == pytest.approx(1.2) and few.speed_points == 3 and not few.stale


def test_a_points_baseline_is_the_median_of_the_calibrations_passes():
    one, two, three = gemm_rows(4, 1), gemm_rows(4, 1, slowdown=1.3), gemm_rows(4, 1, slowdown=0.9)
    times = baseline_times(one + two + three)
    assert len(times) == 4
    assert sorted(times.values()) == pytest.approx(sorted(r.median_s for r in one))


def test_sentinels_are_fixed_per_seed_and_are_not_the_calibrations_own_points():
    a, b = choose_sentinels(0, "cpu"), choose_sentinels(0, "cpu")
    assert a == b and len(a) == 13
    assert {s["family"] for s in a} == {"gemm", "embedding", "elementwise", "memcpy"}
    two = choose_sentinels(0, "cpu", world=2)
    collective = [s for s in two if s["family"] == "collective"]
    assert two[:13] == a and len(collective) == 6 and all(s["params"]["ranks"] == [0, 1] for s in collective)
    calibration_gemms = {s.key for s in gemm_specs(200, 0)}
    assert not calibration_gemms & {s["key"] for s in a if s["family"] == "gemm"}


def test_drill_slows_every_figure_a_point_is_estimated_from():
    from probes.collective import merge_passes

    def visit(windows):
        return Measurement(
            "all_reduce",
            {"bytes": 1024, "world": 2, "scope": "intra"},
            float(np.median(windows)),
            0.1,
            5,
            world_size=2,
            family="collective",
            extra={"window_medians": list(windows)},
        )

    passes = [visit([1.0, 1.2]), visit([1.1, 0.9])]
    plain = merge_passes([visit([1.0, 1.2]), visit([1.1, 0.9])])[0].median_s
    (merged,) = merge_passes(apply_drill(passes, 3.0))
    assert merged.median_s == pytest.approx(3 * plain)


def test_drill_factor_is_read_and_checked(monkeypatch):
    monkeypatch.delenv(DRILL_ENV, raising=False)
    assert drill_slowdown() == 1.0
    monkeypatch.setenv(DRILL_ENV, "2.5")
    assert drill_slowdown() == 2.5
    monkeypatch.setenv(DRILL_ENV, "fast")
    with pytest.raises(ValueError, match="AUTOTUNE_DRILL_SLOWDOWN='fast': expected a number > 0"):
        drill_slowdown()


def log_job(hw: str, version: str, error: float) -> None:
    with mlflow.start_run():
        mlflow.set_tags({"kind": "autotune", "hardware_id": hw, "model_version": version, "job_name": "j"})
        mlflow.log_metrics(
            {"predicted_iteration_ms": 10.0, "measured_iteration_ms": 10.0 / (1 - error), "prediction_error": error}
        )


def test_drift_report_rolls_trends_and_charts_per_version(tracking, tmp_path, capsys):
    for e in (0.05, 0.06, 0.05, 0.07, 0.2, 0.25, 0.3, 0.28):  # v1 degrades
        log_job("hw-a", "1", e)
    for e in (0.06, 0.05, 0.06, 0.05):  # v2 replaces it and holds
        log_job("hw-a", "2", e)
    with mlflow.start_run():
        mlflow.set_tags({"kind": "nightly", "hardware_id": "hw-a", "checked_version": "1"})
        mlflow.log_metrics({"sentinel_gmae": 0.6, "sentinel_bound": 0.35})
    assert drift_cli.main(["--tracking-uri", tracking, "--json", "--last", "8", "--out-dir", str(tmp_path / "c")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    versions = {v["version"]: v for v in report["hardware"]["hw-a"]["versions"]}
    assert versions["1"]["trend"] == "rising" and versions["1"]["trend_ratio"] > 3
    assert versions["2"]["trend"] == "flat"
    assert versions["2"]["rolling_geomean_error"] == pytest.approx(np.exp(np.mean(np.log([0.06, 0.05, 0.06, 0.05]))))
    assert report["hardware"]["hw-a"]["sentinel"][0]["gmae"] == pytest.approx(0.6)
    png = tmp_path / "c" / "drift-hw-a.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The chart is logged to MLflow with the report.
    runs = mlflow.search_runs(
        experiment_names=[registry.EXPERIMENT], filter_string="tags.kind = 'drift'", output_format="list"
    )
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id, "charts")}
    assert artifacts == {"charts/drift-hw-a.png"}


def test_a_second_nightly_sees_the_lock_and_exits_cleanly(tmp_path, capsys):
    from orchestrator import registry
    from orchestrator.lease import Lease

    lock = str(tmp_path / "nightly.lock")
    uri = f"sqlite:///{tmp_path}/m.db"
    registry.configure(uri)
    held = nightly.nightly_lease(lock, 60.0)
    held.holder = "pid 1 on elsewhere"
    assert held.try_acquire()
    try:
        code = nightly_cli.main(["--lock", lock, "--json", "--tracking-uri", uri])
    finally:
        held.release()
    assert code == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1]) == {
        "skipped": True,
        "lock": lock,
        "holder": "pid 1 on elsewhere",
    }
    assert "another nightly run holds" in out.err + out.out
    import mlflow

    assert not mlflow.search_runs(experiment_names=[registry.EXPERIMENT], output_format="list")  # it ran nothing
    # a holder that stops renewing (died, hung, SIGSTOPped) loses the lock once its lease expires
    stale = Lease(f"nightly:{lock}", ttl_s=0.5)
    stale.holder = "a stopped nightly"
    assert stale.try_acquire()
    stale._stop.set()  # its heartbeat no longer runs
    import time

    time.sleep(1.0)
    taker = nightly.nightly_lease(lock, 60.0)
    assert taker.try_acquire() and taker.held() and not stale.held()
    taker.release()

"""Which earlier calibrations lend their whole steps to a new calibration's step fit
(`predictors.step_pool`), and where a calibration finds them (`orchestrator.step_history`)."""

import json

import mlflow
import numpy as np
import pytest
from synthetic_rows import gemm_rows, small_dlrm_job

from orchestrator import registry
from orchestrator.step_history import CALIBRATION_TAG, earlier_calibrations
from predictors import fit_performance_model
from predictors.step_pool import SPEED_BOUND, EarlierCalibration, StepHistory, at_speed, kernel_speed, pool_steps
from probes.vocabulary.ops import DLRM_STEP_OP
from probes.vocabulary.records import Measurement

SOFTWARE = {"torch": "2.13.0+cpu", "fbgemm_gpu": "1.8.0"}


def steps(n: int, name: str = "task") -> list[Measurement]:
    job = small_dlrm_job(name, 2)
    return [
        Measurement(DLRM_STEP_OP, {"job": job, "table_to_rank": [0, 1, 0]}, 5e-3 + 1e-4 * i, 0, 3) for i in range(n)
    ]


def slowed(rows: list[Measurement], factor: float) -> list[Measurement]:
    return [Measurement(r.op, r.params, r.median_s * factor, 0, r.repeats) for r in rows]


@pytest.fixture(scope="module")
def kernels():
    own = gemm_rows(np.random.default_rng(0), 120)
    model, _ = fit_performance_model(own, "hw")
    return model, own


def test_a_calibration_of_this_machine_lends_its_steps_and_others_do_not(kernels):
    model, own = kernels
    earlier_kernels = gemm_rows(np.random.default_rng(1), 120)  # other points, the same machine
    history = StepHistory(
        SOFTWARE,
        [
            EarlierCalibration("same", earlier_kernels + steps(4), dict(SOFTWARE)),
            EarlierCalibration("throttled", slowed(earlier_kernels, 1.3) + steps(5), dict(SOFTWARE)),
            EarlierCalibration("upgraded", earlier_kernels + steps(6), {**SOFTWARE, "torch": "2.14.0+cpu"}),
            EarlierCalibration("no steps", earlier_kernels, dict(SOFTWARE)),
        ],
    )
    lent, verdicts = pool_steps(model, own, history)
    by_label = {v.label: v for v in verdicts}
    assert len(lent) == 4 and all(r.op == DLRM_STEP_OP for r in lent)
    assert by_label["same"].pooled and by_label["same"].speed == pytest.approx(1.0, abs=0.05)
    throttled = by_label["throttled"]
    assert not throttled.pooled and throttled.speed == pytest.approx(1.3, rel=0.05) and "1.30x" in throttled.why
    assert not by_label["upgraded"].pooled and "torch" in by_label["upgraded"].why
    assert not by_label["no steps"].pooled and by_label["no steps"].why == "no whole steps"


def test_the_speed_bound_is_either_way_and_unknown_software_is_never_the_same(kernels):
    model, own = kernels
    faster = slowed(gemm_rows(np.random.default_rng(2), 80), 1 / (SPEED_BOUND + 0.1))
    history = StepHistory(
        SOFTWARE,
        [
            EarlierCalibration("faster", faster + steps(2), dict(SOFTWARE)),
            EarlierCalibration("unknown", own + steps(2)),
        ],
    )
    lent, verdicts = pool_steps(model, own, history)
    assert lent == [] and not any(v.pooled for v in verdicts)
    assert verdicts[0].speed is not None and verdicts[0].speed < 1 / SPEED_BOUND


def test_a_lender_at_another_speed_lends_its_steps_at_this_ones_when_asked(kernels):
    model, own = kernels
    slower = 1.06  # within the bound: lent, but its steps took 6% longer than this machine's now
    lender = slowed(gemm_rows(np.random.default_rng(3), 120), slower) + slowed(steps(3), slower)
    history = StepHistory(SOFTWARE, [EarlierCalibration("slower", lender, dict(SOFTWARE))])
    as_is, _ = pool_steps(model, own, history)
    rescaled, verdicts = pool_steps(model, own, history, rescale_lent=True)
    assert verdicts[0].pooled and "this calibration's speed" in verdicts[0].why
    ratios = [a.median_s / r.median_s for a, r in zip(as_is, rescaled)]
    assert ratios == pytest.approx([verdicts[0].speed] * 3) and verdicts[0].speed == pytest.approx(slower, rel=0.03)
    assert [r.median_s for r in rescaled] == pytest.approx([s.median_s for s in steps(3)], rel=0.03)


def test_at_speed_scales_every_time_a_step_carries():
    captured = [[["all_reduce", 2e-4], ["all_to_all", 1e-4]], [["all_reduce", 4e-4], ["all_to_all", 3e-4]]]
    step = Measurement(DLRM_STEP_OP, {"job": "j", "in_step_collectives": captured}, 6e-3, 1e-3, 5)
    half = at_speed(step, 2.0)
    assert (half.median_s, half.spread_s, half.repeats) == pytest.approx((3e-3, 5e-4, 5))
    assert half.params["in_step_collectives"] == [
        [["all_reduce", 1e-4], ["all_to_all", 5e-5]],
        [["all_reduce", 2e-4], ["all_to_all", 1.5e-4]],
    ]
    assert step.params["in_step_collectives"] is captured and captured[0][0][1] == 2e-4  # the stored row untouched
    assert half.params["job"] == "j"


def test_kernel_speed_prices_a_sample_and_skips_what_the_model_lacks(kernels):
    model, own = kernels
    foreign = [Measurement("embedding_fwd", {"rows": 1}, 1e-3, 0, 1)]
    speed, points = kernel_speed(model, own + foreign, sample=50)
    assert points == 50 and speed == pytest.approx(1.0, abs=0.05)
    assert kernel_speed(model, foreign) == (pytest.approx(float("nan"), nan_ok=True), 0)


def calibration_run(hw: str, directory: str | None, rows: list[Measurement], **tags: str) -> str:
    with mlflow.start_run() as run:
        mlflow.set_tags({"kind": "calibration", "hardware_id": hw, **tags})
        if directory:
            mlflow.set_tag(CALIBRATION_TAG, directory)
        if rows:
            registry.log_measurements(rows, hw)
            mlflow.log_dict({"hardware_id": hw, "software": SOFTWARE}, "fingerprint.json")
        return run.info.run_id


def test_earlier_calibrations_come_from_the_store_newest_first_each_once(tracking):
    hw = "cpu2c-n1-test"
    kernels = gemm_rows(np.random.default_rng(3), 10)
    oldest = calibration_run(hw, "20261101-000000-x", kernels + steps(1, "oldest"))
    calibration_run(hw, None, [])  # failed before logging its table
    calibration_run("other-hw", "20261102-000000-y", kernels + steps(2, "other"))
    calibration_run(hw, "20261103-000000-x", kernels + steps(3, "middle"))
    refit = calibration_run(hw, None, kernels + steps(3, "middle"), refit_of="/somewhere/20261103-000000-x")
    newest = calibration_run(hw, "20261104-000000-x", kernels + steps(4, "newest"))
    with mlflow.start_run():  # the calibration being fitted: its own rows are logged already
        mlflow.set_tags({"kind": "calibration", "hardware_id": hw, CALIBRATION_TAG: "20261105-000000-x"})
        registry.log_measurements(kernels + steps(5, "now"), hw)
        found = earlier_calibrations(hw, "20261105-000000-x", count=3)
        assert [c.label.split(" ")[0] for c in found] == ["20261104-000000-x", "20261103-000000-x", "20261101-000000-x"]
        assert [sum(r.op == DLRM_STEP_OP for r in c.rows) for c in found] == [4, 3, 1]
        # the middle calibration once, from the newer of its two runs (its refit logged the same rows)
        assert newest in found[0].label and refit in found[1].label and oldest in found[2].label
        assert all(c.software == SOFTWARE for c in found)
        assert found[0].rows[-1].params["job"]["name"] == "newest"
        # a refit of the newest calibration does not lend it its own steps
        assert [c.label.split(" ")[0] for c in earlier_calibrations(hw, "20261104-000000-x", count=1)] == [
            "20261103-000000-x"
        ]
    # the rows came back as the plain data that was logged, not objects a loader would have to build
    logged = steps(4, "newest")
    lent = [r for r in found[0].rows if r.op == DLRM_STEP_OP]
    assert [json.loads(json.dumps(r.params)) for r in lent] == [r.params for r in logged]
    assert [r.median_s for r in lent] == pytest.approx([r.median_s for r in logged])

"""Sweep job files (`workload: sweep`): parsed into a `SweepJob`, every bad field named; the
fusion curves a calibration's width rows fit into the bundle, with held-out error; and where a
sweep's width curve comes from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.jobfile import load_any_job, load_job
from predictors.fit import fit_bundle
from predictors.fusion_model import FusionPoint, held_out_errors
from probes.vocabulary.jobspec import JobSpecError
from probes.vocabulary.ops import FUSION_OP
from probes.vocabulary.records import Measurement
from probes.vocabulary.sweep_job import SweepJob
from probes.vocabulary.sweep_validation import REFERENCE_MODELS
from probes.workloads.fusion.models import WORKLOADS, FusionWorkload, workload

REPO = Path(__file__).resolve().parents[1]
GOOD = {
    "name": "s",
    "workload": "sweep",
    "model": "pointnet",
    "search_space": {"lr": {"loguniform": [1e-4, 1e-2]}, "batch_size": 8, "seed": {"randint": [0, 9]}},
    "trials": 4,
}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_example_sweep_parses_and_round_trips(tmp_path):
    job = load_any_job(REPO / "examples/sweep_small.yaml")
    assert isinstance(job, SweepJob) and job.is_reference and job.workload_ref == "pointnet"
    assert job.trials == 8 and job.optimizer == "adam" and job.memory_free_gb is None
    again = load_any_job(write(tmp_path, job.to_dict()))
    assert again == job


def test_reference_models_are_the_fusion_workloads():
    assert tuple(sorted(REFERENCE_MODELS)) == tuple(sorted(WORKLOADS))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"colour": 1}, "colour"),
        ({"factory": "pkg.mod:make"}, "model"),  # both model and factory
        ({"model": "resnet"}, "model"),
        ({"search_space": {"learning_rate": 0.1}}, "search_space.learning_rate"),
        ({"search_space": {"lr": {"normal": [0, 1]}}}, "search_space.lr"),
        ({"search_space": {"lr": {"loguniform": [0, 1]}}}, "search_space.lr.loguniform"),
        ({"search_space": {"lr": {"uniform": [1, 1]}}}, "search_space.lr.uniform"),
        ({"search_space": {"batch_size": {"uniform": [8, 16]}}}, "search_space.batch_size"),
        ({"search_space": {"batch_size": {"choice": [8, 0]}}}, "search_space.batch_size.choice"),
        ({"search_space": {"dropout": {"choice": ["high"]}}}, "search_space.dropout.choice"),
        ({"search_space": {}}, "search_space"),
        ({"trials": 0}, "trials"),
        ({"optimizer": "lamb"}, "optimizer"),
        ({"max_width": 0}, "max_width"),
        ({"memory_free_gb": -1}, "memory_free_gb"),
    ],
)
def test_a_bad_sweep_field_is_named(tmp_path, change, field):
    data = {**GOOD, **change}
    with pytest.raises(JobSpecError) as raised:
        load_any_job(write(tmp_path, data))
    assert field in raised.value.fields, raised.value.problems


def test_a_sweep_without_trials_or_model_names_both(tmp_path):
    data = {k: v for k, v in GOOD.items() if k not in ("trials", "model")}
    with pytest.raises(JobSpecError) as raised:
        load_any_job(write(tmp_path, data))
    assert {"trials", "model"} <= set(raised.value.fields)


def test_commands_of_one_model_refuse_a_sweep(tmp_path):
    with pytest.raises(JobSpecError) as raised:
        load_job(write(tmp_path, GOOD), command="plan")
    assert raised.value.fields == ["workload"] and "autotune takes every workload" in raised.value.problems[0]


def test_autotune_refuses_a_bad_sweep_with_exit_2(tmp_path, capsys):
    from orchestrator.cli import autotune

    path = write(tmp_path, {**GOOD, "optimizer": "lamb"})
    assert autotune.main(["--job", str(path), "--json"]) == 2
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert error["field"] == "optimizer" and "adamw" in error["error"]


def user_workload() -> FusionWorkload:
    """A user's own workload, imported by path (`test_sweep_job:user_workload`)."""
    return workload("cnn")


def test_a_users_factory_is_imported_by_path():
    assert workload("test_sweep_job:user_workload") is WORKLOADS["cnn"]
    with pytest.raises(ValueError, match="cannot import"):
        workload("no_such_module_here:make")
    with pytest.raises(ValueError, match="expected a FusionWorkload"):
        workload("math:pi")


def fusion_rows(workload_name: str, widths: list[int], noise: float, seed: int = 0) -> list[Measurement]:
    """Width rows on a known curve (a=100, b=0.1, c=0.002) and memory line, with noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in widths:
        speed = 100 * w / (1 + 0.1 * w + 0.002 * w * w) * float(np.exp(rng.normal(0, noise)))
        params = {"workload": workload_name, "width": w, "batch_size": 32, "optimizer": "adam"}
        extra = {"samples_per_s": speed, "peak_memory_bytes": 1e8 + 2e7 * w}
        rows.append(Measurement(FUSION_OP, params, w * 32 / speed, 0.0, 5, family="fusion", extra=extra))
    return rows


def test_held_out_widths_score_the_curve_against_a_power_law():
    points = [
        FusionPoint(int(r.params["width"]), r.extra["samples_per_s"], r.extra["peak_memory_bytes"])
        for r in fusion_rows("cnn", [1, 2, 4, 8, 16, 32, 64], 0.0)
    ]
    errors, baseline = held_out_errors(points)
    assert len(errors) == len(baseline) == 5  # the interior widths
    assert errors.max() < 0.02 < baseline.max()  # the curve's own shape, which a power law bends away from
    assert held_out_errors(points[:3])[0].size == 0


def test_a_calibrations_width_rows_give_the_bundle_its_fusion_curves():
    from synthetic_rows import gemm_rows

    rows = gemm_rows(np.random.default_rng(0), 40)
    rows += fusion_rows("pointnet", [1, 2, 4, 8, 16], 0.03) + fusion_rows("cnn", [1, 2], 0.03)
    model, _ = fit_bundle(rows, "hw-sweep")
    assert set(model.fusion) == {"pointnet"}  # two widths of cnn fit nothing ...
    assert "cnn" in model.meta["unfitted"][f"{FUSION_OP}/cnn"]  # ... and say so
    stats = model.metrics[f"{FUSION_OP}/pointnet"]
    assert stats["n"] == 3 and stats["widths"] == [1, 2, 4, 8, 16] and stats["gmae"] < 0.2
    curve = model.fusion["pointnet"]
    assert curve.throughput(8) == pytest.approx(100 * 8 / (1 + 0.8 + 0.128), rel=0.1)


def test_a_sweep_probes_its_own_widths_where_the_bundle_has_no_curve_for_it(monkeypatch, tmp_path, tracking):
    import mlflow

    from orchestrator import sweep

    probed = []

    def fake_probe(workloads, store, max_width, cap, **kwargs):
        probed.append((workloads, kwargs["batch_size"], kwargs["optimizer"]))
        rows = [
            Measurement(
                FUSION_OP,
                {**r.params, "batch_size": kwargs["batch_size"]},
                r.median_s,
                0.0,
                5,
                family="fusion",
                extra=r.extra,
            )
            for r in fusion_rows(workloads[0], [1, 2, 4, 8], 0.0)
        ]
        store.add(rows)  # as the probe stores each row as it comes
        return rows

    monkeypatch.setattr(sweep, "probe_fusion", fake_probe)
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    from synthetic_rows import gemm_rows

    bundle, _ = fit_bundle(gemm_rows(np.random.default_rng(0), 40) + fusion_rows("pointnet", [1, 2, 4], 0.0), "hw")

    class Fingerprint:
        min_device_memory_bytes = 8 * 2**30
        device_kind = "cpu"
        devices_per_node = [2]

    job = load_any_job(REPO / "examples/sweep_small.yaml")  # pointnet at its own batch (32), adam
    with mlflow.start_run():
        assert sweep.fusion_curve(job, bundle, Fingerprint(), 4 * 2**30)[1] == "registered"
        assert probed == []
        other = SweepJob(**{**job.__dict__, "search_space": {**job.search_space, "batch_size": 8}})
        curve, source = sweep.fusion_curve(other, bundle, Fingerprint(), 4 * 2**30)
    assert source == "probed for this sweep" and curve.batch_size == 8
    assert probed == [(["pointnet"], 8, "adam")]


def test_a_fusion_curve_gets_a_sentinel_that_the_nightly_scores_on_it():
    from synthetic_rows import gemm_rows

    from orchestrator.sentinel import fusion_sentinels, score_sentinels

    model, _ = fit_bundle(
        gemm_rows(np.random.default_rng(0), 40) + fusion_rows("pointnet", [1, 2, 4, 8, 16], 0.0), "hw"
    )
    (spec,) = fusion_sentinels(model)
    assert spec["family"] == "fusion" and spec["params"]["width"] == 4  # the middle of 1..16
    params = {k: spec["params"][k] for k in ("workload", "width", "batch_size", "optimizer")}
    on_curve = 4 * 32 / model.fusion["pointnet"].throughput(4)
    rows = [Measurement(FUSION_OP, params, on_curve, 0.0, 5, family="fusion")]
    report = score_sentinels(model, rows)
    assert report.points[0]["op"] == f"{FUSION_OP}/pointnet" and report.points[0]["error"] < 1e-9
    slow = [Measurement(FUSION_OP, params, 3 * on_curve, 0.0, 5, family="fusion")]  # the device got 3x slower
    assert score_sentinels(model, slow).stale

"""Fusion on Ray: the width probe through fresh worker processes, and a Tune sweep run fused."""

from __future__ import annotations

import pytest

from orchestrator.fusion import probe_fusion
from orchestrator.measurement_store import MeasurementStore
from policies.fusion_width import choose_width
from predictors.fusion_model import fit_fusion_models

pytestmark = pytest.mark.slow


def _probe_pointnet(store, *, max_width, memory_cap_bytes, parallel, max_seconds):
    """The width probe of pointnet (batch 8, widening stopped past a 5 s step)."""
    return probe_fusion(
        ["pointnet"],
        store,
        max_width=max_width,
        memory_cap_bytes=memory_cap_bytes,
        step_cap_s=5.0,
        parallel=parallel,
        max_seconds=max_seconds,
        batch_size=8,
    )


def test_probe_widths_fit_and_choose(ray_local, tmp_path) -> None:
    store = MeasurementStore(tmp_path / "fusion")
    rows = _probe_pointnet(store, max_width=4, memory_cap_bytes=4 * 2**30, parallel=2, max_seconds=0.3)
    assert [r.params["width"] for r in rows] == [1, 2, 4]
    assert len(store.rows()) == 3  # persisted as they came
    # Fresh processes: each width's own peak, growing with the width.
    peaks = [r.extra["peak_memory_bytes"] for r in rows]
    assert all(p > 0 for p in peaks) and peaks[-1] > peaks[0]
    model = fit_fusion_models(rows)["pointnet"]
    assert model.widths == [1, 2, 4]
    decision = choose_width(model, memory_cap_bytes=4 * 2**30, max_width=4)
    assert 1 <= decision.choice_detail["width"] <= 4
    assert [c.detail["width"] for c in sorted(decision.candidates, key=lambda c: c.detail["width"])] == [1, 2, 4]


def test_probe_stops_at_the_memory_cap_and_records_why(ray_local, tmp_path) -> None:
    rows = _probe_pointnet(
        MeasurementStore(tmp_path / "fusion"), max_width=64, memory_cap_bytes=1.0, parallel=1, max_seconds=0.2
    )
    assert [r.params["width"] for r in rows] == [1]  # width 1 already holds more than 1 byte


def test_tune_sweep_runs_fused_and_keeps_each_trial(ray_local, tmp_path) -> None:
    from ray import tune

    from orchestrator.fusion_tune import run_sweep, sample_trials

    space = {
        "lr": tune.loguniform(1e-4, 1e-2),
        "dropout": tune.uniform(0.0, 0.2),
        "seed": tune.randint(0, 100),
        "batch_size": tune.grid_search([8, 16]),
    }
    trials = sample_trials(space, 3, seed=1)
    assert len(trials) == 6 and sorted(t["batch_size"] for t in trials) == [8, 8, 8, 16, 16, 16]
    outcome = run_sweep(
        "pointnet", trials, width=4, epochs=2, steps_per_epoch=3, storage=tmp_path / "tune", name="fused"
    )
    # Two batch sizes cannot fuse: two Tune trials of three models each.
    assert sorted(len(g) for g in outcome.groups) == [3, 3]
    assert [t.trial_id for t in outcome.trials] == [f"trial_{i:03d}" for i in range(6)]
    for t in outcome.trials:
        assert t.config == trials[int(t.trial_id[-3:])]
        assert [h["epoch"] for h in t.history] == [1, 2]
        assert t.group_width == 3
        assert 0.0 <= t.final["val_accuracy"] <= 1.0
    losses = {round(t.final["val_loss"], 6) for t in outcome.trials}
    assert len(losses) == 6  # each trial its own model
    # each group's training throughput per epoch, at its full width
    assert [len(r) for r in outcome.group_samples_per_s] == [2, 2]
    assert all(v > 0 for r in outcome.group_samples_per_s for v in r)
    assert outcome.measured_samples_per_s(3) > 0 and outcome.measured_samples_per_s(4) is None
    assert outcome.best().final["val_loss"] == min(t.final["val_loss"] for t in outcome.trials)


def test_fuse_cli_logs_the_decision(ray_local, tracking, capsys) -> None:
    import json

    import mlflow

    from orchestrator.cli import fuse

    code = fuse.main(
        [
            "--workload",
            "cnn",
            "--max-width",
            "4",
            "--memory-cap-gb",
            "4",
            "--probe-seconds",
            "0.3",
            "--trials",
            "10",
            "--tracking-uri",
            tracking,
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(map(int, out["measured"])) == [1, 2, 4]
    assert 1 <= out["width"] <= 4 and sum(out["groups"]) == 10
    run = mlflow.get_run(out["run_id"])
    assert run.data.tags["kind"] == "fusion" and run.data.metrics["chosen_width"] == out["width"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(out["run_id"])}
    assert {"fusion_model.json", "fusion_decision.json", "measurements.jsonl"} <= artifacts


def test_tune_sweep_runs_the_users_own_model(ray_local, tmp_path) -> None:
    """Only the model factory and the data come from the user; the fused loop is ours."""
    import torch
    from torch import nn

    from orchestrator.fusion_tune import run_sweep
    from probes.workloads.fusion.hfta import RateDropout
    from probes.workloads.fusion.models import FusionWorkload

    # Defined here, not at module level, so Tune's workers receive them by value (as a
    # user's own functions in a driver script are).
    def _user_model() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), RateDropout(), nn.Linear(16, 10))

    def _user_batch(n: int, gen: torch.Generator):
        y = torch.randint(0, 10, (n,), generator=gen)
        return torch.randn(n, 6, generator=gen) + y[:, None].float() / 5, y

    work = FusionWorkload("user_mlp", _user_model, _user_batch, 8)
    trials = [{"lr": 1e-3 * (i + 1), "seed": i, "optimizer": "sgd", "momentum": 0.9} for i in range(4)]
    outcome = run_sweep(work, trials, width=4, epochs=1, steps_per_epoch=4, storage=tmp_path / "tune", name="user")
    assert outcome.groups == [["trial_000", "trial_001", "trial_002", "trial_003"]]
    assert len({round(t.final["val_loss"], 6) for t in outcome.trials}) == 4


def test_successive_halving_stops_single_trials_inside_fused_groups(ray_local, tmp_path) -> None:
    from orchestrator.fusion_tune import MemberHalving, RungBoard, run_sweep

    rule = MemberHalving(grace_period=1, reduction_factor=2, max_t=4)
    assert rule.rungs() == [1, 2]
    board = RungBoard(rule)
    assert board.judge(1, {"a": 1.0}) == {"a": True}  # the first at a rung always goes on
    assert board.judge(1, {"b": 2.0, "c": 0.5}) == {"b": False, "c": True}
    assert board.judge(3, {"d": 9.0}) == {"d": True}  # not a rung

    trials = [{"lr": lr, "seed": i} for i, lr in enumerate([1e-2, 1e-6, 3e-3, 1e-6, 1e-2, 1e-6, 3e-3, 1e-6])]
    # One group of eight, so the order trials reach a rung (and so every decision) is fixed.
    outcome = run_sweep(
        "pointnet",
        trials,
        width=8,
        epochs=4,
        steps_per_epoch=6,
        storage=tmp_path / "tune",
        name="halving",
        halving=rule,
    )
    runs = {t.trial_id: len(t.history) for t in outcome.trials}
    assert max(runs.values()) == 4 and min(runs.values()) < 4  # some stopped early, some ran to the end
    assert sum(runs.values()) < 4 * len(trials)
    for t in outcome.trials:
        assert [h["epoch"] for h in t.history] == list(range(1, len(t.history) + 1))
    # The trials that barely train (lr 1e-6) are cut at the first rung, each behind a better one.
    assert {tid: n for tid, n in runs.items() if trials[int(tid[-3:])]["lr"] == 1e-6} == {
        "trial_001": 1,
        "trial_003": 1,
        "trial_005": 1,
        "trial_007": 1,
    }


def test_a_sweep_through_autotune_takes_its_width_from_the_registered_bundle(ray_local, tracking, tmp_path, capsys):
    """`autotune --job sweep.yaml`: the champion's fusion curve chooses the width, the trials run
    fused through Tune, and the run holds predicted vs measured throughput and every trial."""
    import json

    import mlflow
    import numpy as np
    import yaml
    from synthetic_rows import gemm_rows

    from orchestrator import registry
    from orchestrator.cli import autotune
    from orchestrator.cli.common import fingerprint
    from predictors.fit import fit_bundle

    fp = fingerprint(None, start_ray=True)
    rows = _probe_pointnet(
        MeasurementStore(tmp_path / "widths"), max_width=4, memory_cap_bytes=4 * 2**30, parallel=1, max_seconds=0.3
    )
    bundle, test_rows = fit_bundle(gemm_rows(np.random.default_rng(0), 40) + rows, fp.hardware_id)
    assert "pointnet" in bundle.fusion
    with mlflow.start_run():
        assert registry.register_bundle(bundle, test_rows, fp.software).promoted
    job = {
        "name": "sweep_test",
        "workload": "sweep",
        "model": "pointnet",
        "search_space": {"lr": {"loguniform": [1e-4, 1e-2]}, "batch_size": 8, "seed": {"randint": [0, 99]}},
        "trials": 8,  # at any chosen width (1, 2 or 4) some group runs full width: its throughput is measured
        "epochs": 2,
        "steps_per_epoch": 3,
        "max_width": 4,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(job))
    code = autotune.main(["--job", str(path), "--recalibrate", "never", "--tracking-uri", tracking, "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, out
    assert out["curve"] == "registered" and out["width"] in (1, 2, 4) and out["trials"] == 8
    assert sum(out["groups"]) == 8 and max(out["groups"]) <= out["width"]
    assert out["predicted_samples_per_s"] > 0
    run = mlflow.get_run(out["run_id"])
    assert run.data.metrics["chosen_width"] == out["width"]
    assert max(out["groups"]) == out["width"]  # a group ran at the chosen width: its throughput measured
    assert run.data.metrics["measured_samples_per_s"] == out["measured_samples_per_s"] > 0
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(out["run_id"])}
    assert {"fusion_model.json", "fusion_decision.json", "trials.json", "trial_histories.json"} <= artifacts
    histories = mlflow.artifacts.load_dict(f"runs:/{out['run_id']}/trial_histories.json")
    assert sorted(histories) == [f"trial_{i:03d}" for i in range(8)]
    assert all([h["epoch"] for h in history] == [1, 2] for history in histories.values())

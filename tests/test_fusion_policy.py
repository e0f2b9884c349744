"""Fusion-width model and policy: curve fit, memory cap, choice, trial grouping, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.fusion_width import FusionPolicyError, choose_width, infusible_key, partition_trials
from predictors.fusion_model import FusionModel, FusionModelError, FusionPoint

MIB = 2**20


def _points(a: float, b: float, c: float, widths=(1, 2, 4, 8, 16, 32, 64), noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for w in widths:
        speed = a * w / (1 + b * w + c * w * w) * (1 + noise * rng.standard_normal())
        out.append(FusionPoint(w, speed, 300 * MIB + 20 * MIB * w))
    return out


def test_fit_recovers_a_known_curve_and_memory_line() -> None:
    model = FusionModel.fit("toy", 32, "adam", _points(1000.0, 0.2, 0.002))
    assert model.a == pytest.approx(1000.0, rel=1e-3)
    assert model.b == pytest.approx(0.2, rel=1e-2)
    assert model.c == pytest.approx(0.002, rel=5e-2)
    assert model.memory_intercept == pytest.approx(300 * MIB, rel=1e-6)
    assert model.memory_slope == pytest.approx(20 * MIB, rel=1e-6)
    assert model.fit_gmae < 1e-3
    assert model.extrapolated(128) and not model.extrapolated(3)


def test_fit_needs_three_widths() -> None:
    with pytest.raises(FusionModelError, match="3 or more widths"):
        FusionModel.fit("toy", 32, "adam", _points(1000.0, 0.2, 0.0, widths=(1, 2)))


def test_policy_picks_the_knee_under_the_memory_cap() -> None:
    # Peak at 1/sqrt(c) = 22.4.
    model = FusionModel.fit("toy", 32, "adam", _points(1000.0, 0.05, 0.002))
    decision = choose_width(model, memory_cap_bytes=8 * 2**30, max_width=64)
    assert [c.detail["width"] for c in sorted(decision.candidates, key=lambda c: c.detail["width"])] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
    ]  # widths of the form that was measured
    width = decision.choice_detail["width"]
    best = max(model.throughput(w) for w in (1, 2, 4, 8, 16, 32, 64))
    assert width == 16  # 32 is the fastest; 16 is within 2% of it and the smallest such
    assert model.throughput(16) >= 0.98 * best > model.throughput(8)
    # Every integer width when asked: the smallest within 2% of the peak.
    every = choose_width(model, memory_cap_bytes=8 * 2**30, max_width=64, widths=range(1, 65))
    w = every.choice_detail["width"]
    assert model.throughput(w) >= 0.98 * max(model.throughput(v) for v in range(1, 65)) > model.throughput(w - 1)
    # Memory: 300 MiB + 20 MiB per model under a 500 MiB cap allows 10 models.
    capped = choose_width(model, memory_cap_bytes=500 * MIB, max_width=64)
    assert capped.choice_detail["width"] == 8 and capped.choice_detail["limited_by"] == "memory"
    assert capped.choice_detail["width_limit"] == 10
    infeasible = [c for c in capped.candidates if not c.feasible]
    assert sorted(c.detail["width"] for c in infeasible) == [16, 32, 64]
    assert all("exceeds the cap" in c.detail["reason"] for c in infeasible)
    with pytest.raises(FusionPolicyError, match="even one model"):
        choose_width(model, memory_cap_bytes=100 * MIB)


def test_model_round_trips_through_json() -> None:
    model = FusionModel.fit("toy", 32, "sgd", _points(500.0, 0.1, 0.0, noise=0.03))
    again = FusionModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model
    assert again.throughput(7) == model.throughput(7)


def test_partition_fuses_only_equal_infusible_settings() -> None:
    trials = [{"lr": 10**-i, "batch_size": 32 if i % 3 else 64, "dropout": 0.1} for i in range(11)]
    groups = partition_trials(trials, width=4)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(11))  # every trial exactly once
    for g in groups:
        assert len(g) <= 4
        assert len({trials[i]["batch_size"] for i in g}) == 1
    sizes = sorted(len(g) for g in groups)
    # 7 trials at batch 32 -> 4 + 3; 4 at batch 64 -> 4.
    assert sizes == [3, 4, 4]
    assert infusible_key({"lr": 1, "seed": 2, "arch": "a"}) == infusible_key({"lr": 3, "seed": 5, "arch": "a"})
    assert len(partition_trials(trials, width=1)) == 11
    assert [len(g) for g in partition_trials([{"lr": i} for i in range(10)], width=8)] == [5, 5]

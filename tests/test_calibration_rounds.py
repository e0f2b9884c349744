"""A calibration's training points run in rounds between shares of its kernel points
(`orchestrator.calibrate.measure_rounds`), so its whole steps sample the host over the sweep;
the probe runners are replaced here by ones that measure a fixed number of points a call."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import calibrate
from orchestrator.measurement_store import MeasurementStore
from probes.probe import ProbeSpec


def _specs(family: str, n: int) -> list[ProbeSpec]:
    return [ProbeSpec(family, {"i": i}, f"{family}-{i}") for i in range(n)]


@pytest.fixture
def runs(monkeypatch) -> list[tuple[str, list[str], Any]]:
    """Every runner call in order: (kind, keys of the points it was given, gang members).
    A call measures its first 3 points, fails the 4th (recorded), leaves the rest."""
    calls: list[tuple[str, list[str], Any]] = []

    def run(kind: str, phase: calibrate.Phase, members: Any = None) -> tuple[int, int]:
        calls.append((kind, [s.key for s in phase.specs], members))
        measured = list(phase.specs[:3])
        phase.store.mark_done([s.to_dict() for s in measured])
        for spec in phase.specs[3:4]:
            phase.store.add_failure(spec.to_dict(), "timed out", 2)
        return len(measured), len(phase.specs[3:4])

    monkeypatch.setattr(calibrate, "run_collective_probes", lambda phase, members=None: run("training", phase, members))
    monkeypatch.setattr(calibrate, "run_local_probes", lambda phase: run("kernels", phase))
    return calls


def test_training_points_alternate_with_kernels_and_carry_what_a_round_left(tmp_path, runs) -> None:
    store = MeasurementStore(tmp_path)
    work = calibrate.Rounds(_specs("step", 12), _specs("node_step", 3), [0, 1], _specs("gemm", 30))
    rounds = calibrate.TRAINING_ROUNDS
    done, failed = calibrate.measure_rounds(None, store, work, 0.0, budget_s=600.0)  # type: ignore[arg-type]

    kinds = [kind for kind, _, _ in runs]
    assert kinds == ["training", "training", "kernels"] * rounds  # each round: both scopes, then kernels
    whole = [keys for kind, keys, members in runs if kind == "training" and members is None]
    within = [keys for kind, keys, members in runs if kind == "training" and members == [0, 1]]
    assert len(whole) == len(within) == rounds
    # 12 points in 3 rounds: 4 new a round; the 5th of the round before (neither measured nor
    # failed) goes first in the next, the failed 4th is not retried
    assert whole[0] == [f"step-{i}" for i in range(4)]
    assert whole[1] == [f"step-{i}" for i in range(4, 8)]
    assert whole[2] == [f"step-{i}" for i in range(8, 12)]
    assert all(keys == [f"node_step-{i}"] for i, keys in enumerate(within))
    kernels = [keys for kind, keys, _ in runs if kind == "kernels"]
    assert kernels[0][0] == "gemm-0" and kernels[1][0] == "gemm-4" and kernels[2][0] == "gemm-8"
    assert not set(kernels[1]) & {"gemm-0", "gemm-1", "gemm-2", "gemm-3"}  # measured or failed: not again
    assert done == sum(min(3, len(keys)) for _, keys, _ in runs)
    assert failed == sum(1 for _, keys, _ in runs if len(keys) > 3)


def test_a_round_carries_the_points_its_time_left(tmp_path, runs) -> None:
    """Six new points a round, three measured and one failed: the other two go first next round."""
    store = MeasurementStore(tmp_path)
    calibrate.measure_rounds(None, store, calibrate.Rounds(_specs("step", 18), [], [], []), 0.0, budget_s=600.0)  # type: ignore[arg-type]
    whole = [keys for kind, keys, _ in runs if kind == "training"]
    assert whole[0] == [f"step-{i}" for i in range(6)]
    assert whole[1] == ["step-4", "step-5"] + [f"step-{i}" for i in range(6, 12)]


def test_a_budget_too_short_for_rounds_runs_the_training_points_once(tmp_path, runs) -> None:
    """25 s: a third of the training share would be under `MIN_ROUND_S`."""
    store = MeasurementStore(tmp_path)
    calibrate.measure_rounds(
        None, store, calibrate.Rounds(_specs("step", 3), [], [], _specs("gemm", 3)), 0.0, budget_s=25.0
    )  # type: ignore[arg-type]
    assert [kind for kind, _, _ in runs] == ["training", "kernels"]


def test_without_training_points_the_kernels_run_once(tmp_path, runs) -> None:
    """One device: no training points, one kernel phase to the end."""
    store = MeasurementStore(tmp_path)
    calibrate.measure_rounds(None, store, calibrate.Rounds([], [], [], _specs("gemm", 5)), 0.0, budget_s=600.0)  # type: ignore[arg-type]
    assert [kind for kind, _, _ in runs] == ["kernels"]

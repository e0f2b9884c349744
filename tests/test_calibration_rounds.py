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


def test_the_floor_is_measured_before_the_first_kernels_even_when_the_budget_is_spent(tmp_path, monkeypatch) -> None:
    """A calibration whose time ran out before its kernels (a short budget on a slow host)
    still measures the floor, with a deadline of its own, and then the rest as before."""
    import time

    phases: list[tuple[list[str], float]] = []

    def local(phase: calibrate.Phase) -> tuple[int, int]:
        phases.append(([s.key for s in phase.specs], phase.deadline))
        phase.store.mark_done([s.to_dict() for s in phase.specs[:1]])
        return 1, 0

    monkeypatch.setattr(calibrate, "run_collective_probes", lambda phase, members=None: (0, 0))
    monkeypatch.setattr(calibrate, "run_local_probes", local)
    store = MeasurementStore(tmp_path)
    spent = time.monotonic() - 1000.0  # started 1000 s ago on a 20 s budget
    work = calibrate.Rounds(_specs("step", 3), [], [], _specs("gemm", 4), floor=_specs("relu", 2))
    calibrate.measure_rounds(None, store, work, spent, budget_s=20.0)  # type: ignore[arg-type]
    (floor, floor_deadline), (rest, _) = phases
    assert floor == ["relu-0", "relu-1"] and rest == [f"gemm-{i}" for i in range(4)]
    assert floor_deadline >= time.monotonic() + calibrate.FLOOR_LIMIT_S - 60


def test_planner_coverage_takes_every_ops_first_point_before_any_ops_second() -> None:
    """Cut anywhere, the coverage has measured the planner's ops alike; its floor is the first
    two of each."""
    from probes.elementwise import elementwise_specs
    from probes.embedding import embedding_specs
    from probes.gemm import gemm_specs
    from probes.memcpy import memcpy_specs
    from probes.sweep import interleave

    sweep = interleave(gemm_specs(400, 0), embedding_specs(300, 0), elementwise_specs(400, 0), memcpy_specs(100, 0))
    coverage = calibrate.planner_coverage(sweep)
    ops = [calibrate._coverage_op(s) for s in coverage]
    planner = {"gemm", "embedding", "memcpy", *calibrate.PLANNER_ELEMENTWISE_OPS}
    assert set(ops) == planner
    assert all(ops.count(op) == calibrate.COVERAGE_POINTS for op in planner)
    for cut in range(1, len(ops) + 1):
        counts = [ops[:cut].count(op) for op in planner]
        assert max(counts) - min(counts) <= 1
    floor = calibrate.coverage_floor(coverage)
    assert floor == coverage[: calibrate.FLOOR_POINTS * len(planner)]


def test_a_longer_budget_takes_more_steps_and_keeps_the_shorter_ones_first() -> None:
    """Up to the reference budget a calibration takes the base counts of DLRM and transformer
    steps; a longer one takes them in proportion, and its first steps are the very points a
    shorter budget measures (each drawn from the seed and its index alone)."""
    from probes.training import training_specs, transformer_training_specs

    base = (calibrate.TRAINING_PROBES, calibrate.TRANSFORMER_PROBES)
    assert calibrate.training_counts(25.0) == base
    assert calibrate.training_counts(calibrate.STEP_REFERENCE_BUDGET_S) == base
    assert calibrate.training_counts(3 * calibrate.STEP_REFERENCE_BUDGET_S) == (3 * base[0], 3 * base[1])
    longer, shorter = calibrate.training_counts(1800.0), calibrate.training_counts(600.0)
    assert [s.to_dict() for s in training_specs(longer[0], seed=5, world=2)[: shorter[0]]] == [
        s.to_dict() for s in training_specs(shorter[0], seed=5, world=2)
    ]
    assert [s.to_dict() for s in transformer_training_specs(longer[1], seed=5, world=2)[: shorter[1]]] == [
        s.to_dict() for s in transformer_training_specs(shorter[1], seed=5, world=2)
    ]

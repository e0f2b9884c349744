"""Where a stored e2e run's error comes from (`benchmarks/error_sources.py`): the run's lean
against its tasks' scatter, the measurement's share of that scatter, and prices re-anchored on
a reading of the host's speed."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.error_sources import Stored, Task, anchoring, bars, decomposition, load, median_noise


def run(cycle: str, pairs: list[tuple[float, float]], drift: float | None = None, rounds: int = 3) -> Stored:
    tasks = [Task(p, m, [m] * rounds) for p, m in pairs]
    return Stored(cycle, tasks, drift, None, drift)


def test_the_median_of_more_rounds_moves_less_and_one_round_moves_by_its_own_scatter():
    assert median_noise(0.1, 1) == pytest.approx(0.1, rel=0.01)
    three, five = median_noise(0.1, 3), median_noise(0.1, 5)
    assert five < three < 0.1
    assert three == pytest.approx(0.067, abs=0.002)  # the median of three normals: 0.67 of one's sd


def test_a_lean_every_task_shares_is_told_from_the_scatter_about_it():
    scatter = [(1.1, 1.0), (0.9, 1.0), (1.05, 1.0), (0.95, 1.0)]
    leaning = [(p * 1.3, m) for p, m in scatter]
    parts = decomposition([run("a", scatter), run("b", leaning)])
    within = np.log([1.1, 0.9, 1.05, 0.95])
    assert parts["lean_sd"] == pytest.approx(np.log(1.3) / np.sqrt(2), rel=0.05)
    assert parts["within_sd"] == pytest.approx(np.sqrt(2 * np.sum((within - within.mean()) ** 2) / 6), rel=1e-6)
    assert parts["round_sd"] == 0.0 and parts["model_within_sd"] == pytest.approx(parts["within_sd"])


def test_prices_re_anchored_on_the_hosts_drift_meet_the_bars_only_where_the_drift_was_the_lean():
    slower_host = run("a", [(10.0, 12.0), (20.0, 24.5), (5.0, 5.9)] * 4, drift=1.2)  # everything ran 20% slow
    assert not bars(slower_host, 1.0)["met"]
    assert bars(slower_host, 1.2)["met"]
    misread = run("b", [(10.0, 10.2), (20.0, 19.8), (5.0, 5.1)] * 4, drift=1.2)  # a reading the run did not bear
    verdict = anchoring([slower_host, misread])["first_steps"]
    assert (verdict["met_as_priced"], verdict["met_anchored"], verdict["runs"]) == (1, 1, 2)


def test_a_check_not_taken_before_the_first_round_is_not_a_plans_reading():
    task = {"predicted_ms": 10.0, "measured_ms": 11.0, "measured_rounds_ms": [11.0, 10.5, 11.5]}
    data = {
        "tasks": [task, {**task, "tensor_parallel": 2}],
        "step_checks": [{"label": "after round 1", "now_over_stored": 1.1}],
        "host_checks": [{"label": "before round 1", "all": {"geomean_ratio": 0.95}}],
    }
    stored = load(data, "2026-12-07 02:00")
    assert len(stored.tasks) == 1  # the tensor-parallel task is not one the bars judge
    assert stored.first_steps is None and stored.first_kernels == 0.95 and stored.all_steps == pytest.approx(1.1)


def test_the_bars_hit_rate_falls_as_the_runs_lean_or_their_tasks_scatter():
    from benchmarks.error_sources import bar_shares, hit_rate

    assert hit_rate(0.0, 0.001) == 1.0
    assert hit_rate(0.5, 0.5) < 0.01
    assert hit_rate(0.06, 0.07) > hit_rate(0.09, 0.07) and hit_rate(0.06, 0.07) > hit_rate(0.06, 0.10)
    # a lean alone misses the signed bar and leaves the others (its tasks' errors sit at the floor's
    # side of 10% and 25% while the lean is small); a scatter alone misses the max and geomean most
    leaning = bar_shares(0.07, 0.001)
    assert leaning["signed"] < 0.6 and leaning["geomean"] > leaning["signed"] and leaning["all"] <= leaning["signed"]
    scattered = bar_shares(0.0, 0.2)
    assert scattered["max"] < scattered["geomean"] < scattered["signed"]


def test_the_transfer_is_told_apart_by_whether_the_calibration_kept_its_in_step_factors():
    from benchmarks.error_sources import in_step_verdict, transfer_by_in_step

    lines = (
        "[autotune]   in-step collective factors: dlrm (all_gather 4.14x, all_reduce 4.15x) dropped: its steps left "
        "out in turn 8.0% with them, 4.3% without; transformer (all_reduce 2.91x) kept: its steps left out in turn"
    )
    assert in_step_verdict(lines, "dlrm") == "dropped" and in_step_verdict(lines, "transformer") == "kept"
    assert in_step_verdict("[autotune] fitting", "dlrm") is None
    data = {"tasks": [], "mean_signed_error": 0.10, "own_steps_signed": 0.02}
    kept = [
        load(data, "a", lines, "transformer"),
        load({**data, "mean_signed_error": -0.06}, "b", lines, "transformer"),
    ]
    dropped = [load(data, "c", lines, "dlrm"), load({**data, "mean_signed_error": 0.04}, "d", lines, "dlrm")]
    assert kept[0].transfer == pytest.approx(0.08)
    figures = transfer_by_in_step(kept + dropped)
    assert figures["all"]["runs"] == 4 and figures["kept"]["runs"] == figures["dropped"]["runs"] == 2
    assert figures["kept"]["sd"] > figures["dropped"]["sd"]
    assert figures["dropped"]["mean"] == pytest.approx(0.05)


def test_the_verdict_is_read_back_from_the_line_the_calibration_prints():
    """`error_sources.in_step_verdict` reads the stored cycles' printed calibration lines, so it
    must read what `step_fit.in_step_verdict` writes: a change of wording there fails here, not
    silently as every run's verdict turning None."""
    from benchmarks.error_sources import in_step_verdict as read_verdict
    from predictors.step_fit import in_step_verdict

    stats = {
        "kept": True,
        "dlrm": {"factors": {"all_reduce": 3.92}, "kept": False, "steps_gmae": 0.08, "baseline_steps_gmae": 0.07},
        "transformer": {"factors": {"all_reduce": 2.46}, "kept": True, "steps_gmae": 0.05, "baseline_steps_gmae": 0.09},
    }
    printed = f"[autotune]   {in_step_verdict(stats)}"
    assert read_verdict(printed, "dlrm") == "dropped" and read_verdict(printed, "transformer") == "kept"


def test_a_failed_first_check_leaves_the_run_without_a_plans_reading():
    task = {"predicted_ms": 10.0, "measured_ms": 11.0, "measured_rounds_ms": [11.0, 10.5, 11.5]}
    data = {
        "tasks": [task],
        "step_checks": [
            {"label": "before round 1", "error": "a step failed to run again"},
            {"label": "after round 1", "now_over_stored": 1.1},
        ],
    }
    stored = load(data, "2026-12-06 03:40")
    assert stored.first_steps is None  # the reading after round 1 is not one a plan could take
    assert stored.all_steps == pytest.approx(1.1)

"""The end-to-end benchmarks' summaries: each figure with its count and 95% interval over the tasks."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from benchmarks.e2e_accuracy import error_summary, interval_text, signed_summary


def tasks(*pairs: tuple[float, float]) -> list[dict]:
    return [{"predicted_ms": p, "measured_ms": m} for p, m in pairs]


def test_a_lean_shared_by_every_task_is_told_from_noise():
    leaning = signed_summary(tasks((9.0, 10.0), (18.5, 20.0), (27.0, 30.0), (8.8, 10.0)))
    low, high = leaning["mean_signed_interval"]
    assert leaning["mean_signed_error"] == pytest.approx((-0.1 - 0.075 - 0.1 - 0.12) / 4)
    assert low < leaning["mean_signed_error"] < high < 0  # every task under: the interval excludes zero
    mixed = signed_summary(tasks((9.0, 10.0), (11.0, 10.0), (9.5, 10.0), (10.5, 10.0)))
    low, high = mixed["mean_signed_interval"]
    assert low < 0 < high


def test_one_task_has_a_figure_but_no_interval():
    one = signed_summary(tasks((9.0, 10.0)))
    assert one["mean_signed_error"] == pytest.approx(-0.1) and one["mean_signed_interval"] is None
    summary = error_summary([0.1])
    assert summary["count"] == 1 and summary["geomean_interval"] is None
    assert interval_text(None) == ""


def test_the_geomean_interval_brackets_it_and_narrows_with_more_tasks():
    few = error_summary([0.05, 0.1, 0.2])
    many = error_summary([0.05, 0.1, 0.2] * 8)
    assert few["count"] == 3 and many["count"] == 24
    assert few["geomean_interval"][0] < few["geomean_error"] < few["geomean_interval"][1]
    assert many["geomean_error"] == pytest.approx(few["geomean_error"])
    width = lambda s: s["geomean_interval"][1] - s["geomean_interval"][0]  # noqa: E731
    assert width(many) < width(few)
    assert interval_text([0.05, 0.2]) == " [5.0%, 20.0%]"
    assert interval_text([-0.1, 0.02], signed=True) == " [-10.0%, +2.0%]"


def test_the_tally_tells_a_missing_fixed_cost_from_a_runs_level():
    """Two runs, one leaning 10% lower than the other at every batch: the level goes into
    `signed`, not `relative`; a step missing 1 ms at every batch shows as the same
    milliseconds however long its step."""
    from benchmarks.issue26_tally import judge, lean_by_batch

    def run(level: float) -> dict:
        tasks = [
            {"batch_size": b, "measured_ms": m, "predicted_ms": (m - 1.0) * (1 + level)}
            for b, m in ((128, 10.0), (128, 12.0), (1024, 50.0), (1024, 40.0))
        ]
        errors = [(t["predicted_ms"] - t["measured_ms"]) / t["measured_ms"] for t in tasks]
        return {"tasks": tasks, "geomean_error": 0.1, "max_error": 0.2, "mean_signed_error": sum(errors) / 4}

    lean = lean_by_batch([judge(run(0.0)), judge(run(-0.1))])
    assert lean[128]["runs"] == 2 and lean[128]["tasks"] == 4
    assert lean[128]["signed"] < lean[1024]["signed"] < 0
    assert lean[128]["relative"] < 0 < lean[1024]["relative"]  # the slope, with each run's level out
    # the first run misses 1 ms everywhere; the second also 10% of the step: 1.9 and 2.1 ms at
    # batch 128, 5.9 and 4.9 ms at 1024
    assert lean[128]["missing_ms"] == pytest.approx((1.0 + 2.0) / 2)
    assert lean[1024]["missing_ms"] == pytest.approx((1.0 + 5.4) / 2)


def test_the_tally_sets_the_steps_with_exposed_communication_against_their_run():
    """Tasks whose exposed communication is a large share of their predicted step, priced 20%
    over their run's others: their band sits above zero with each run's level taken out, the
    other band below; tasks without the figure (a DLRM run's) give no band."""
    from benchmarks.issue26_tally import judge, lean_by_exposed

    def run(level: float) -> dict:
        tasks = [
            {"measured_ms": 10.0, "predicted_ms": 10.0 * (1 + level + extra), "exposed_comm_ms": exposed}
            for exposed, extra in ((0.5, 0.0), (0.8, 0.0), (6.0, 0.2))
        ]
        errors = [(t["predicted_ms"] - t["measured_ms"]) / t["measured_ms"] for t in tasks]
        return {"tasks": tasks, "geomean_error": 0.1, "max_error": 0.3, "mean_signed_error": sum(errors) / 3}

    lean = lean_by_exposed([judge(run(0.0)), judge(run(-0.1))])
    assert set(lean) == {"0.00-0.10", "0.35-inf"}
    assert lean["0.35-inf"]["relative"] > 0 > lean["0.00-0.10"]["relative"]
    assert lean["0.35-inf"]["relative"] - lean["0.00-0.10"]["relative"] == pytest.approx(0.2, rel=0.1)
    assert lean["0.35-inf"]["runs"] == 2 and lean["0.00-0.10"]["tasks"] == 4
    dlrm = {
        "tasks": [{"batch_size": 128, "measured_ms": 10.0, "predicted_ms": 11.0}],
        "geomean_error": 0.1,
        "max_error": 0.1,
        "mean_signed_error": 0.1,
    }
    assert lean_by_exposed([judge(dlrm)]) == {}


def test_the_tally_pairs_a_runs_lean_with_its_own_steps_timed_beside_it():
    """Runs whose lean is their own steps' plus a little: a gap near zero, a high correlation;
    runs without step checks are left out, and fewer than three paired runs give no figure."""
    from benchmarks.issue26_tally import Run, own_steps_pairing

    def run(signed: float, own: float | None, stored: float | None = 0.01) -> Run:
        return Run(0.1, 0.2, signed, 12, 1, True, None, own, stored)

    following = [run(-0.17, -0.18), run(-0.24, -0.19, None), run(0.06, 0.05), run(-0.02, -0.04), run(0.30, None)]
    pairing = own_steps_pairing(following)
    assert pairing["runs"] == 4
    bar = pairing["signed_bar"]
    assert (bar["tasks"], bar["own_steps_now"]) == (1, 2)
    assert (bar["own_steps_stored"], bar["own_steps_stored_known"]) == (3, 3)
    assert pairing["gap"] == pytest.approx(np.mean([0.01, -0.05, 0.01, 0.02]))
    assert pairing["gap_interval"][0] < pairing["gap"] < pairing["gap_interval"][1]
    assert pairing["correlation"] > 0.9
    unrelated = own_steps_pairing([run(-0.2, 0.1), run(0.1, -0.2), run(-0.1, 0.05), run(0.05, -0.1)])
    assert unrelated["correlation"] < 0
    assert own_steps_pairing(following[:2]) is None


def test_the_tally_reads_a_tasks_launches_against_the_other_load_beside_them():
    """Launches taken relative to their task's: the load's shares less the task's mean, the times
    over the task's median; tensor-parallel tasks, launches without a share and runs without any
    are left out, and launches slower beside more load correlate positively."""
    from benchmarks.issue26_tally import judge, other_load_pairing

    def task(shares: list, ms: list[float], tensor_parallel: int = 1) -> dict:
        row = {"measured_ms": float(np.median(ms)), "predicted_ms": 10.0, "error": 0.1, "batch_size": 128}
        return {**row, "measured_rounds_ms": ms, "host_other_share_rounds": shares, "tensor_parallel": tensor_parallel}

    def data(tasks: list[dict]) -> dict:
        return {"tasks": tasks, "geomean_error": 0.1, "max_error": 0.2, "mean_signed_error": 0.0, "task_seed": 1}

    slowed = judge(data([task([0.0, 0.1, 0.2], [10.0, 11.0, 12.0]), task([0.3, None, 0.1], [50.0, 1.0, 40.0])]))
    expected = [
        (-0.1, np.log(10 / 11)),
        (0.0, 0.0),
        (0.1, np.log(12 / 11)),
        (0.1, np.log(50 / 45)),
        (-0.1, np.log(40 / 45)),
    ]
    assert np.asarray(slowed.other_load) == pytest.approx(np.asarray(expected))
    left_out = judge(data([task([0.0, 0.5], [10.0, 20.0], tensor_parallel=2), task([None, None], [1.0, 2.0])]))
    assert left_out.other_load is None
    pairing = other_load_pairing([slowed, left_out])
    assert (pairing["runs"], pairing["launches"]) == (1, 5)
    assert pairing["correlation"] > 0.9 and pairing["slope"] > 0
    sped = judge(data([task([0.0, 0.1, 0.2], [12.0, 11.0, 10.0])]))
    assert other_load_pairing([sped])["correlation"] < 0
    assert other_load_pairing([left_out]) is None


def test_a_lean_that_follows_the_table_count_is_told_and_a_redrawn_mismatch_is_left_out(tmp_path):
    """`lean_by_task` redraws each task's tables from its run's seed: a lean made to follow the
    table count correlates with it within a batch (after the run's level is taken out), one made
    to follow the measured step correlates with that instead, and a run whose stored table counts the generator does not give back is left out, not misread."""
    import json
    import math

    from benchmarks.lean_by_task import correlations, run_tasks
    from probes.workloads.random_dlrm import random_dlrm_tasks

    specs = random_dlrm_tasks(12, 2, seed=7)
    rows = [
        {
            "name": s.name,
            "sharder": "naive",
            "tables": len(s.tables),
            "batch_size": 128,  # one batch, so every task's tables, not its batch, tell them apart
            "measured_ms": 10.0,
            "predicted_ms": 10.0 * (1 + 0.05 * math.log(len(s.tables))) - 0.7,
        }
        for s in specs
    ]
    run = tmp_path / "dlrm_0000.json"
    run.write_text(json.dumps({"task_seed": 7, "scale": 1.0, "world_size": 2, "tasks": rows}))
    tasks, why = run_tasks(run)
    assert why is None and len(tasks) == 12
    assert abs(sum(t["lean"] for t in tasks)) < 1e-9  # the run's level is out
    r = correlations(tasks)[128]["correlation"]
    assert r["log_tables"] == pytest.approx(1.0)
    for i, row in enumerate(rows):  # now a lean that follows the measured step, not the tables
        row["measured_ms"] = 5.0 * 1.3**i
        row["predicted_ms"] = row["measured_ms"] * (1 + 0.05 * math.log(row["measured_ms"]))
    run.write_text(json.dumps({"task_seed": 7, "scale": 1.0, "world_size": 2, "tasks": rows}))
    r = correlations(run_tasks(run)[0])[128]["correlation"]
    assert r["log_measured_ms"] == pytest.approx(1.0) and r["log_tables"] < 0.999
    rows[0]["tables"] += 1
    run.write_text(json.dumps({"task_seed": 7, "scale": 1.0, "world_size": 2, "tasks": rows}))
    assert run_tasks(run) == ([], "its tasks redrawn from the seed have other table counts (another generator)")


def test_a_feature_is_judged_on_the_stored_cycles_that_have_both_their_rows_and_a_dlrm_run(tmp_path):
    """`overhead_feature_refit` takes a cycle only where its rows and its DLRM run are both
    stored, the newest `last` of them in order of day and time, and its paired change is the
    mean of with - without over the cycles."""
    from benchmarks.overhead_feature_refit import paired, run_of, stored_cycles

    for day, stamps, runs in (
        ("20261201", ["2028", "2330"], ["2028"]),
        ("20261202", ["0336", "0706"], ["0336", "0706"]),
    ):
        folder = tmp_path / f"e2e_issue26_{day}"
        folder.mkdir()
        for stamp in stamps:
            (folder / f"measurements_{stamp}.jsonl.gz").write_bytes(b"")
        for stamp in runs:
            (folder / f"dlrm_{stamp}.json").write_text("{}")
        (folder / "measurements_0706_rerun.jsonl.gz").write_bytes(b"")  # a variant, not a cycle
    found = stored_cycles(tmp_path, 2)
    assert [p.name for p in found] == ["measurements_0336.jsonl.gz", "measurements_0706.jsonl.gz"]
    assert [p.parent.name for p in stored_cycles(tmp_path, 9)] == ["e2e_issue26_20261201"] + [
        "e2e_issue26_20261202"
    ] * 2
    assert run_of(found[0]).name == "dlrm_0336.json"
    with pytest.raises(SystemExit, match="measurements_HHMM"):
        run_of(tmp_path / "dlrm_0336.json")
    cycles = [{"with": {"g": w}, "without": {"g": wo}} for w, wo in ((0.05, 0.07), (0.06, 0.07), (0.08, 0.08))]
    change = paired(cycles, "g")
    assert change["mean_change"] == pytest.approx(-0.01) and change["cycles"] == 3
    assert change["interval"][0] < -0.01 < change["interval"][1]


def test_the_step_sample_spread_leaves_a_quarter_out_and_scales_as_a_delete_d_jackknife():
    """`step_sample_spread` draws distinct quarters of the steps from one seeded stream, and its
    jackknife turns the draws' spread into the full fit's: a figure that does not move with the
    steps drawn has none, and one whose draws spread has sqrt(kept / left out) times their sd."""
    from benchmarks.step_sample_spread import jackknife_sd, left_out_draws, summary_of

    draws = left_out_draws(24, 5, seed=3)
    assert draws == left_out_draws(24, 5, seed=3) and len(draws) == 5
    assert all(len(d) == 6 and len(set(d)) == 6 and all(0 <= i < 24 for i in d) for d in draws)
    assert len({tuple(d) for d in draws}) > 1
    assert left_out_draws(3, 2)[0] and len(left_out_draws(3, 2)[0]) == 1
    assert jackknife_sd(np.full(8, -0.04), 24, 6) == 0.0
    values = np.array([-0.05, -0.03] * 4)
    assert jackknife_sd(values, 24, 6) == pytest.approx(np.sqrt(3) * 0.01)
    cycles = [
        {
            "all_steps": {"mean_signed_error": s},
            "jackknife_sd": {k: 0.02 for k in ("mean_signed_error", "geomean_error", "max_error")},
        }
        for s in (-0.06, 0.02)
    ]
    summary = summary_of(cycles)
    assert summary["signed_across_cycles"]["mean"] == pytest.approx(-0.02)
    assert summary["mean_jackknife_sd"]["mean_signed_error"] == pytest.approx(0.02)


def test_the_step_sample_spread_draws_over_the_steps_the_fit_keeps():
    """The fit keeps the task-shaped DLRM steps when there are enough of them
    (`step_fit.task_shaped_steps`), so a draw leaves out a quarter of those, not a varying count
    of them among every step; with too few task steps the fit, and so the draws, take every step."""
    from benchmarks.step_sample_spread import fitted_step_indices
    from predictors.dlrm_estimator import OVERHEAD_FEATURES
    from predictors.opmodels import SPARE_ROWS
    from probes.vocabulary.ops import DLRM_STEP_OP
    from probes.vocabulary.records import Measurement

    def step(name: str) -> Measurement:
        return Measurement(DLRM_STEP_OP, {"job": {"name": name}}, 0.01, 0.0, 30)

    other = Measurement("gemm", {"m": 8}, 1e-4, 0.0, 10)
    enough = len(OVERHEAD_FEATURES) + SPARE_ROWS
    rows = [other] + [step(f"task{2 * i + 1}") if i % 2 else step(f"light{2 * i}") for i in range(2 * enough)]
    kept = fitted_step_indices(rows)
    assert len(kept) == enough and all(rows[i].params["job"]["name"].startswith("task") for i in kept)
    few = [other, step("task1"), step("light2"), step("overhead0")]
    assert fitted_step_indices(few) == [1, 2, 3]


def test_the_transformer_step_lean_groups_steps_by_layout_and_averages_per_cycle():
    """`transformer_step_lean` names each step's layout family by the framework work it adds,
    tells a small stack (probe index 0 mod 4) from a task-shaped one, and averages each group
    per cycle before over cycles (a cycle's steps share a fit and a spell)."""
    from benchmarks.transformer_step_lean import layout_family, step_group, summary_of
    from probes.vocabulary.ops import TRANSFORMER_STEP_OP
    from probes.vocabulary.records import Measurement
    from probes.vocabulary.transformer_spec import TransformerSpec

    base = {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "batch_size": 4, "world_size": 2}
    assert layout_family(TransformerSpec(**base)) == "data parallel"
    assert layout_family(TransformerSpec(**base, tensor_parallel=2)) == "tensor parallel"
    assert layout_family(TransformerSpec(**base, fsdp="full_shard")) == "fsdp"
    assert layout_family(TransformerSpec(**base, pipeline_parallel=2, micro_batches=2)) == "pipeline"
    assert layout_family(TransformerSpec(**base, recompute=True)) == "micro-batched"

    def row(name: str) -> Measurement:
        return Measurement(TRANSFORMER_STEP_OP, {"transformer": {**base, "name": name}}, 0.01, 0.0, 10)

    assert step_group(row("probe8")) == "data parallel float32 small"
    assert step_group(row("probe5")) == "data parallel float32 task"
    cycles = [
        {"groups": {"fsdp float32 task": {"steps": 3, "mean_signed": -0.06}}},
        {"groups": {"fsdp float32 task": {"steps": 1, "mean_signed": -0.02}, "x": {"steps": 2, "mean_signed": 0.1}}},
    ]
    summary = summary_of(cycles)
    assert summary["fsdp float32 task"]["mean_signed"] == pytest.approx(-0.04)
    assert (summary["fsdp float32 task"]["cycles"], summary["fsdp float32 task"]["steps"]) == (2, 4)
    assert summary["x"]["interval"] is None and summary["x"]["cycles"] == 1


def test_the_launch_share_is_the_geomean_of_the_task_ratios_with_an_interval_from_two_tasks():
    from benchmarks.launch_vs_probe import launch_share

    share = launch_share([1.03, 1.04, 1.035])
    assert share["geomean"] == pytest.approx((1.03 * 1.04 * 1.035) ** (1 / 3))
    assert share["low"] < share["geomean"] < share["high"] and share["tasks"] == 3
    assert share["low"] > 1.0  # every task slower under the launcher, consistently: past 1
    one = launch_share([1.1])
    assert one["geomean"] == pytest.approx(1.1) and one["low"] is None and one["high"] is None


def test_a_launch_later_over_first_is_its_last_third_over_its_first_and_none_under_three_steps():
    from benchmarks.launch_vs_probe import later_over_first

    assert later_over_first([12.0, 10.0, 11.0, 9.0, 6.0, 5.0, 6.0]) == pytest.approx(5.5 / 11.0)
    assert later_over_first([10.0, 10.0]) is None


def test_warmth_reads_each_probe_round_warm_over_fresh_and_skips_what_cannot_be_read():
    from benchmarks.launch_vs_probe import warmth

    repeats = [[20.0, 18.0, 19.0, 17.0], [10.0, 9.0, 8.0], [10.0, 8.8]]
    warm = warmth(repeats, [[10.0] * 6, [12.0, 12.0, 9.0, 9.0]])
    probe = warm["probe_warm_over_fresh"]
    assert probe["geomean"] == pytest.approx((0.9 * 0.85 * 0.88) ** (1 / 3)) and probe["rounds"] == 3
    assert probe["high"] < 1.0  # every round faster warm, consistently: under 1
    launch = warm["launch_later_over_first"]
    assert launch["geomean"] == pytest.approx(0.75**0.5) and launch["rounds"] == 2
    single = warmth([[20.0], [10.0]], [[10.0, 10.0]])
    assert single == {"probe_warm_over_fresh": None, "launch_later_over_first": None}


def test_the_transformer_overhead_refit_pairs_each_variant_with_the_default(tmp_path):
    """`transformer_overhead_refit` takes a cycle only where its rows and its transformer run
    are both stored; `layout_work` is 1 for the layouts with hooks or several passes and 0 for
    plain data and tensor parallel, and `wrapped_passes` counts those passes; and each
    variant's paired change is its figure minus the default's, cycle by cycle, over the
    cycles."""
    from benchmarks.transformer_overhead_refit import DEFAULT, VARIANTS, run_of, stored_cycles, summarize
    from predictors.transformer_estimator import layout_work, wrapped_passes
    from probes.vocabulary.transformer_spec import TransformerSpec

    folder = tmp_path / "e2e_issue26_20261204"
    folder.mkdir()
    for stamp in ("1530", "1716", "1845"):
        (folder / f"measurements_{stamp}.jsonl.gz").write_bytes(b"")
    for stamp in ("1530", "1845"):
        (folder / f"transformer_{stamp}.json").write_text("{}")
    (folder / "dlrm_1716.json").write_text("{}")  # a DLRM run alone does not make a transformer cycle
    assert [p.name for p in stored_cycles(tmp_path, 9)] == ["measurements_1530.jsonl.gz", "measurements_1845.jsonl.gz"]
    assert run_of(folder / "measurements_1530.jsonl.gz").name == "transformer_1530.json"

    base = {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "batch_size": 4, "world_size": 2}
    assert (
        layout_work(TransformerSpec(**base)) == 0.0 and layout_work(TransformerSpec(**base, tensor_parallel=2)) == 0.0
    )
    for wrapped in (
        dict(fsdp="full_shard"),
        dict(recompute=True),
        dict(micro_batches=2),
        dict(pipeline_parallel=2, micro_batches=2),
    ):
        assert layout_work(TransformerSpec(**base, **wrapped)) == 1.0
    # `wrapped_passes` counts that work: 0 for plain layouts, FSDP's 2 blocks + root twice a
    # micro-batch, a recomputed block per stage, two passes per micro-batch beyond the first
    assert wrapped_passes(TransformerSpec(**base)) == 0.0
    assert wrapped_passes(TransformerSpec(**base, tensor_parallel=2)) == 0.0
    assert wrapped_passes(TransformerSpec(**base, fsdp="full_shard")) == 6.0
    assert wrapped_passes(TransformerSpec(**base, fsdp="full_shard", micro_batches=2)) == 14.0
    assert wrapped_passes(TransformerSpec(**base, recompute=True)) == 2.0
    assert wrapped_passes(TransformerSpec(**base, pipeline_parallel=2, micro_batches=4, recompute=True)) == 10.0

    def judged(signed: float, geomean: float, met: bool) -> dict:
        run = {"geomean_error": geomean, "max_error": 2 * geomean, "mean_signed_error": signed, "met": met}
        return {
            "steps_left_out_gmae": 0.05,
            "lean_by_layout": {"fsdp": {"steps": 2, "mean_signed": signed - 0.1}},
            "data_parallel": run,
        }

    cycles = [
        {
            "variants": {
                label: judged(s + (0.02 if label != DEFAULT else 0.0), 0.06, label == DEFAULT) for label in VARIANTS
            }
        }
        for s in (-0.04, 0.06)
    ]
    summary = summarize(cycles)
    assert summary[DEFAULT]["dp_mean_signed"] == pytest.approx(0.01)
    assert summary[DEFAULT]["dp_mean_abs_signed"] == pytest.approx(0.05)
    assert summary[DEFAULT]["dp_bars_met"] == 2 and summary["one slowdown"]["dp_bars_met"] == 0
    assert "paired" not in summary[DEFAULT]
    change = summary["one slowdown"]["paired"]["mean_signed_error"]
    assert change["mean_change"] == pytest.approx(0.02) and change["cycles"] == 2
    assert summary["one slowdown"]["paired"]["tp_geomean_error"] is None  # no run had TP tasks
    assert summary[DEFAULT]["lean_by_layout"]["fsdp"] == pytest.approx(-0.09)


def test_transformer_overhead_refit_summarizes_the_variants_run_and_names_unknown_ones(monkeypatch, capsys):
    from benchmarks import transformer_overhead_refit as refit

    run = {"geomean_error": 0.05, "max_error": 0.1, "mean_signed_error": 0.01, "met": True}
    judged = {"steps_left_out_gmae": 0.05, "lean_by_layout": {}, "data_parallel": run}
    summary = refit.summarize([{"variants": {refit.DEFAULT: judged}}])
    assert list(summary) == [refit.DEFAULT]  # only the variants the cycles were judged on
    monkeypatch.setattr(sys, "argv", ["transformer_overhead_refit.py", "--variants", "default,no such fit"])
    with pytest.raises(SystemExit) as exit_:
        refit.main()
    assert exit_.value.code == 2 and "--variants: no such fit not among default" in capsys.readouterr().err


def test_transformer_overhead_refit_reprices_the_runs_own_steps_and_spreads_the_transfer(monkeypatch):
    """The candidate that never keeps the transformer's in-step factors leaves the DLRM's rule
    as it is; a variant's signed error on the calibration's own steps is the median over the
    step checks that returned of the mean over each check's steps, at the variant's prices,
    against the times re-measured then; and the transfer's sd is over the runs that have one."""
    import dataclasses

    from benchmarks import transformer_overhead_refit as refit
    from probes.vocabulary.records import Measurement

    assert refit.VARIANTS["in-step factors never kept"].in_step_workloads() == ("dlrm",)
    assert refit.VARIANTS[refit.DEFAULT].in_step_workloads() == ("dlrm", "transformer")
    spec = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 16, "batch_size": 4, "world_size": 2}
    rows = [
        Measurement("transformer_step", {"transformer": {**spec, "name": name}}, seconds, 0.0, 5)
        for name, seconds in (("a", 0.010), ("b", 0.020))
    ]
    prices = {"a": 0.011, "b": 0.018}  # seconds
    kind = dataclasses.replace(
        refit.OWN_STEPS["transformer"],
        like_tasks=lambda row: True,
        price_s=lambda model, row: prices[row.params["transformer"]["name"]],
    )
    monkeypatch.setattr(refit, "OWN_STEPS", {"transformer": kind})
    run = {
        "step_checks": [
            {
                "label": "before round 1",
                "steps": [
                    {"name": "a", "now_ms": 10.0, "stored_ms": 10.0},
                    {"name": "b", "now_ms": 20.0, "stored_ms": 20.0},
                ],
            },
            {"label": "after round 1", "error": "RuntimeError: the gang did not form"},
            {
                "label": "after round 2",
                "steps": [
                    {"name": "a", "now_ms": 11.0, "stored_ms": 10.0},
                    {"name": "b", "now_ms": 16.0, "stored_ms": 20.0},
                ],
            },
        ]
    }
    # each check's mean: (+10% - 10%) / 2 = 0 and (0% + 12.5%) / 2 = 6.25%; the failed one left out
    assert refit.own_steps_signed(None, rows, run) == pytest.approx(0.03125)
    late = {
        "label": "after round 3",
        "steps": [{"name": "a", "now_ms": 10.0, "stored_ms": 10.0}, {"name": "b", "now_ms": 15.0, "stored_ms": 20.0}],
    }
    run["step_checks"].append(late)  # (+10% + 20%) / 2 = 15%
    assert refit.own_steps_signed(None, rows, run) == pytest.approx(0.0625)  # the median of three
    assert refit.own_steps_signed(None, rows, {}) is None


def test_transformer_overhead_refit_counts_a_cycle_fitted_at_several_seeds_once():
    """A cycle fitted at several seeds (`--seeds`) is one measured run: each paired change and
    the transfer's spread take its mean over the seeds; and the candidate that never keeps the
    transformer's in-step factors is also judged over the fits where the default kept them."""
    from benchmarks import transformer_overhead_refit as refit

    candidate = "in-step factors never kept"

    def fit(rows: str, seed: int, signed: float, kept: bool, transfer: float | None) -> dict:
        def judged(signed: float, kept: bool, transfer: float | None) -> dict:
            run = {"geomean_error": 0.05, "max_error": 0.1, "mean_signed_error": signed, "met": abs(signed) <= 0.05}
            return {
                "steps_left_out_gmae": 0.05,
                "lean_by_layout": {},
                "data_parallel": run,
                "in_step_kept": kept,
                "transfer": transfer,
            }

        moved = 0.04 if kept else 0.0  # the candidate moves a fit only where the default kept
        return {
            "rows": rows,
            "seed": seed,
            "variants": {
                refit.DEFAULT: judged(signed, kept, transfer),
                candidate: judged(signed + moved, False, None if transfer is None else transfer + moved),
            },
        }

    cycles = [
        fit("a", 0, 0.0, True, 0.02),
        fit("a", 1, 0.0, False, 0.00),
        fit("b", 0, 0.0, False, -0.02),
        fit("b", 1, 0.0, False, None),
        fit("c", 0, 0.0, True, 0.06),
    ]
    summary = refit.summarize(cycles)
    assert summary[refit.DEFAULT]["fits"] == 5 and summary[refit.DEFAULT]["cycles"] == 3
    assert summary[refit.DEFAULT]["in_step_kept"] == 2 and summary[candidate]["in_step_kept"] == 0
    # the transfer by cycle: a (0.02 + 0) / 2, b -0.02, c 0.06
    assert summary[refit.DEFAULT]["transfer_runs"] == 3
    assert summary[refit.DEFAULT]["transfer_mean"] == pytest.approx(0.05 / 3)
    change = summary[candidate]["paired"]["mean_signed_error"]
    assert change["cycles"] == 3 and change["mean_change"] == pytest.approx((0.02 + 0.0 + 0.04) / 3)
    kept = summary[candidate]["where_default_kept"]
    assert kept["fits"] == 2 and kept["cycles"] == 2
    assert kept["paired"]["mean_signed_error"]["mean_change"] == pytest.approx(0.04)
    assert kept["transfer"][refit.DEFAULT]["transfer_sd"] == pytest.approx(np.std([0.02, 0.06], ddof=1))
    assert "where_default_kept" not in summary[refit.DEFAULT]
    assert refit.seed_list("0,3") == [0, 3]
    with pytest.raises(Exception, match="comma-separated non-negative integers"):
        refit.seed_list("0,-1")


def test_transformer_overhead_refit_says_how_the_default_turns_on_the_seed():
    from benchmarks import transformer_overhead_refit as refit

    def fit(rows: str, kept: bool, signed: float) -> dict:
        run = {"geomean_error": 0.05, "max_error": 0.1, "mean_signed_error": signed, "met": True}
        return {"rows": rows, "variants": {refit.DEFAULT: {"in_step_kept": kept, "data_parallel": run}}}

    cycles = [
        fit("a", True, 0.01),
        fit("a", True, 0.02),
        fit("b", True, -0.02),
        fit("b", False, -0.06),  # turns on the seed, and moves 4 points
        fit("c", False, 0.0),
        fit("c", False, 0.0),
        fit("d", True, 0.3),  # one fit: not a run fitted at several seeds
    ]
    turns = refit.seed_turns(cycles)
    assert turns["runs"] == 3
    assert (turns["kept_at_some_seed"], turns["kept_at_every_seed"], turns["turning_on_seed"]) == (2, 1, 1)
    assert turns["widest_signed_range"] == {"rows": "b", "low": -0.06, "high": -0.02}
    assert refit.seed_turns(cycles[-1:]) == {
        "runs": 0,
        "kept_at_some_seed": 0,
        "kept_at_every_seed": 0,
        "turning_on_seed": 0,
        "widest_signed_range": None,
    }


def test_transformer_overhead_refit_pairs_the_default_with_another_codes_on_the_same_cycles():
    from benchmarks.transformer_overhead_refit import DEFAULT, against

    def cycle(rows: str, signed: float, tp: float | None = None) -> dict:
        run = {"geomean_error": 0.05, "max_error": 0.1, "mean_signed_error": signed, "met": abs(signed) <= 0.05}
        judged = {"steps_left_out_gmae": 0.05, "data_parallel": run}
        if tp is not None:
            judged["tensor_parallel"] = {"geomean_error": tp}
        return {"rows": rows, "variants": {DEFAULT: judged}}

    before = {"command": "old", "cycles": [cycle("/elsewhere/a/m_1.jsonl.gz", 0.08, 0.1), cycle("a/m_2.jsonl.gz", 0.0)]}
    now = [cycle("a/m_1.jsonl.gz", 0.04, 0.07), cycle("a/m_2.jsonl.gz", -0.02), cycle("a/m_3.jsonl.gz", 0.5)]
    changes = against(now, before)
    assert (
        changes["mean_signed_error"]["mean_change"] == pytest.approx(-0.03)
        and changes["mean_signed_error"]["cycles"] == 2
    )
    assert changes["abs_mean_signed_error"]["mean_change"] == pytest.approx(-0.01)
    assert changes["tp_geomean_error"] == {"mean_change": pytest.approx(-0.03), "interval": None, "cycles": 1}
    assert changes["bars_met"] == [1, 2]  # the cycle only one side judged is left out


def test_two_codes_outputs_are_paired_cycle_by_cycle_on_their_default_fits():
    from benchmarks.overhead_feature_refit import pair_outputs

    def arm(geomean: float, signed: float, steps: float, met: bool) -> dict:
        return {
            "geomean_error": geomean,
            "max_error": 2 * geomean,
            "mean_signed_error": signed,
            "steps_left_out_gmae": steps,
            "met": met,
        }

    def output(feature: str, arms: dict[str, dict], other: dict) -> dict:
        default = "with" if feature == "tables_total" else "without"
        cycles = [
            {
                "rows": f"/elsewhere/e2e_issue26_x/measurements_{k}.jsonl.gz",
                default: a,
                ("without" if default == "with" else "with"): other,
            }
            for k, a in arms.items()
        ]
        return {"feature": feature, "cycles": cycles}

    junk = arm(9.0, 9.0, 9.0, False)  # the other arm: never read
    before = output("tables_total", {"a": arm(0.05, -0.02, 0.05, True), "b": arm(0.08, 0.06, 0.06, False)}, junk)
    # written by a candidate's run: its default fit is "without"; cycle c has no pair
    after = output(
        "memory_alongside_s",
        {"a": arm(0.06, -0.04, 0.05, True), "b": arm(0.06, 0.04, 0.05, True), "c": arm(0.5, 0.5, 0.5, False)},
        junk,
    )
    paired = pair_outputs(before, after)
    assert paired["geomean_error"]["cycles"] == 2
    assert paired["geomean_error"]["mean_change"] == pytest.approx(-0.005)
    assert paired["abs_mean_signed_error"]["mean_change"] == pytest.approx(0.0)  # 0.02 -> 0.04, 0.06 -> 0.04
    assert paired["steps_left_out_gmae"]["mean_change"] == pytest.approx(-0.005)
    assert paired["max_error"]["interval"] is not None
    assert paired["bars_met"] == [1, 2]


def test_paired_changes_give_their_mean_interval_and_count():
    from predictors.evaluation import mean_change

    assert mean_change([]) is None
    assert mean_change([0.02]) == {"mean_change": pytest.approx(0.02), "interval": None, "cycles": 1}
    change = mean_change(np.array([0.01, 0.03, 0.02]))
    assert change["mean_change"] == pytest.approx(0.02) and change["cycles"] == 3
    low, high = change["interval"]
    assert low < 0.02 < high  # a t-interval around the mean over the cycles

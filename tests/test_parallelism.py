"""Transformer job files and the parallelism policy: every layout that divides the job, the
memory cap refusing what would not fit, recomputation priced only where it is needed, the
fastest feasible layout chosen with every candidate kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from policies import parallelism
from policies.parallelism import (
    UNPRICED_RECOMPUTE,
    LayoutPricer,
    ParallelismPolicy,
    enumerate_layouts,
    layout_gemms,
    micro_batch_options,
)
from policies.policy import decide
from policies.sharders import NoFeasiblePlanError
from predictors.transformer_estimator import TransformerEstimate
from predictors.transformer_memory import transformer_memory
from probes.vocabulary.jobspec import JobSpecError
from probes.vocabulary.jobspec_validation import parse_job
from probes.vocabulary.transformer_job import TransformerJob

REPO = Path(__file__).resolve().parents[1]
JOB = dict(workload="transformer", world_size=4, layers=4, hidden=64, heads=4, seq_len=16, global_batch=8)


def job(**kw) -> TransformerJob:
    return TransformerJob.from_dict({**JOB, **kw})


def test_the_example_job_loads_and_round_trips():
    data = yaml.safe_load((REPO / "examples/transformer_small.yaml").read_text())
    loaded = parse_job(data)
    assert isinstance(loaded, TransformerJob) and loaded.vocab_size == 2048 and loaded.global_batch == 16
    assert parse_job(loaded.to_dict()) == loaded


@pytest.mark.parametrize(
    "change, field, expected",
    [
        (dict(heads=5), "heads", "heads: expected a divisor of hidden=64, got 5"),
        (dict(layers=0), "layers", "layers: expected an integer >= 1, got 0; allowed: 1..1024"),
        (dict(seq_len=2**21), "seq_len", "seq_len: expected an integer <= 1048576"),
        (dict(dtype="fp8"), "dtype", "allowed: float32, bfloat16, float16"),
        (dict(dropout=1.5), "dropout", "dropout: expected a dropout probability"),
        (dict(vocab_size=-1), "vocab_size", "vocab_size: expected an integer >= 0"),
        (dict(tables=[]), "tables", "tables: unknown field; allowed fields are"),
        (dict(global_batch=None), "global_batch", "global_batch: expected an integer >= 1, got None"),
    ],
)
def test_bad_transformer_jobs_name_the_field(change, field, expected):
    with pytest.raises(JobSpecError) as caught:
        parse_job({**JOB, **change})
    assert field in caught.value.fields and expected in str(caught.value)


def test_a_bad_transformer_job_file_exits_2_before_anything_starts(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**JOB, "heads": 5, "dtype": "fp8"}))
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.autotune", "--job", "bad.yaml", "--json"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "heads: expected a divisor of hidden=64, got 5" in proc.stderr
    assert "dtype" in proc.stdout and not (tmp_path / ".autotune").exists()


def test_layouts_divide_the_job():
    layouts = list(enumerate_layouts(job()))
    names = {s.layout for s in layouts}
    assert len(names) == len(layouts)  # no layout twice
    for s in layouts:
        assert s.data_parallel * s.tensor_parallel * s.pipeline_parallel == 4
        assert s.batch_size * s.data_parallel == 8 and s.batch_size % s.micro_batches == 0
        assert s.fsdp == "none" or (s.tensor_parallel == s.pipeline_parallel == 1 and s.data_parallel > 1)
    assert {
        "dp4-tp1-pp1-mb1",
        "dp1-tp4-pp1-mb1",
        "dp1-tp1-pp4-mb8",
        "dp2-tp2-pp1-mb2-rc",
        "dp4-tp1-pp1-mb2-full_shard",
    } <= names
    assert micro_batch_options(12) == [1, 2, 4] and micro_batch_options(256)[-1] == 64


def test_a_data_parallel_degree_that_does_not_split_the_batch_is_left_out_with_the_reason():
    skipped: dict[str, str] = {}
    layouts = list(enumerate_layouts(job(global_batch=6), skipped))
    assert all(s.data_parallel in (1, 2) for s in layouts)
    assert skipped == {"dp4-tp1-pp1": "global_batch=6 does not split over 4 data-parallel replicas"}


def _fake_estimates(monkeypatch, times: dict[str, float]) -> None:
    """Stand in for the simulator: a layout's time from its name (else from its micro-batches and
    recomputation), so the policy's rules are checked without a calibrated bundle."""

    def estimate(spec, model, placement=None, memo=None):
        from predictors.simulator import RankTimeline, SimResult

        seconds = times.get(spec.layout, 1.0 + spec.micro_batches * 0.01 + spec.recompute * 0.5)
        result = SimResult(seconds, [RankTimeline()], [], [])
        return TransformerEstimate(seconds, seconds, result, memory=transformer_memory(spec))

    monkeypatch.setattr(parallelism, "estimate_transformer_iteration", estimate)


def test_the_fastest_feasible_layout_wins_and_every_candidate_is_kept(monkeypatch):
    _fake_estimates(monkeypatch, {"dp1-tp2-pp2-mb4": 0.5})
    decision = decide(ParallelismPolicy(job()), LayoutPricer(None, 2**40))  # type: ignore[arg-type]
    assert decision.choice == "dp1-tp2-pp2-mb4" and decision.predicted_ms == pytest.approx(500)
    assert len(decision.candidates) == len(list(enumerate_layouts(job())))
    # recomputation is priced only where the layout without it does not fit
    recomputed = [c for c in decision.candidates if "-rc" in c.name]
    assert recomputed and all(not c.feasible and c.detail["reason"] == UNPRICED_RECOMPUTE for c in recomputed)
    assert decision.choice_detail["plain_data_parallel_ms"] == pytest.approx(1010)


def test_the_memory_cap_refuses_layouts_with_their_peak_and_recomputation_then_counts(monkeypatch):
    _fake_estimates(monkeypatch, {})
    big = job(layers=8, hidden=512, heads=8, seq_len=512, global_batch=16, world_size=2)
    plain = transformer_memory(big.spec())
    recomputed = transformer_memory(big.spec(recompute=True))
    cap = (plain.peak + recomputed.peak) / 2  # plain DP does not fit; with recomputation it does
    decision = decide(ParallelismPolicy(big), LayoutPricer(None, cap))  # type: ignore[arg-type]
    by_name = {c.name: c for c in decision.candidates}
    refused = by_name["dp2-tp1-pp1-mb1"]
    assert not refused.feasible and "GiB per rank, over the cap" in refused.detail["reason"]
    assert by_name["dp2-tp1-pp1-mb1-rc"].feasible  # priced: the plain layout does not fit
    assert all(c.detail["memory"]["peak"] <= cap for c in decision.candidates if c.feasible)


def test_no_layout_that_fits_is_a_no_feasible_plan_naming_the_cap(monkeypatch):
    _fake_estimates(monkeypatch, {})
    with pytest.raises(NoFeasiblePlanError, match="no layout of job fits") as caught:
        decide(ParallelismPolicy(job()), LayoutPricer(None, 1024))  # type: ignore[arg-type]
    assert caught.value.field == "memory_cap_gb"


def test_a_calibration_for_the_job_measures_its_layouts_gemms():
    shapes = layout_gemms(job())
    assert shapes and len(shapes) <= parallelism.MAX_JOB_GEMMS
    assert {"M", "N", "K", "dtype", "variant", "batch"} == set(shapes[0])
    assert any(s["batch"] > 1 for s in shapes)  # the attention's batched products too

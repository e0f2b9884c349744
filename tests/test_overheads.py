"""Per-op CPU overheads from real profiled training steps, and the model that stores them."""

import json

import pytest
import torch
import torch.distributed as dist
from dlrm_overheads import local_process_group, profile_dlrm_overheads
from synthetic_rows import small_dlrm_job
from torch import nn

from predictors.opmodels import OpModel
from predictors.overhead_model import OverheadModel, weighted_median
from probes.overhead_trace import extract_overheads
from probes.overheads import POOLED, profile_overheads, summarise
from probes.vocabulary.ops import CPU_OVERHEAD_OP
from probes.vocabulary.records import Measurement

ITERATIONS = 5


def _mlp_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64)

    def step():
        loss = nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


@pytest.fixture(scope="module")
def mlp_rows():
    return profile_overheads(_mlp_step(), iterations=ITERATIONS, warmup=2, workload="mlp")


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    job = small_dlrm_job("tiny", world_size=1)
    trace = tmp_path_factory.mktemp("et") / "dlrm_et.json"
    rows = profile_dlrm_overheads(job, iterations=ITERATIONS, warmup=2, trace_path=str(trace))
    return rows, trace


def _by_key(rows):
    return {(r.params["kind"], r.params["aten_op"]): r for r in rows}


def _check_rows(rows, workload):
    keys = _by_key(rows)
    kinds = {k for k, _ in keys}
    assert {"gap", "dispatch"} <= kinds
    assert "launch" not in kinds, "no kernel launches on CPU"
    for r in rows:
        assert r.op == CPU_OVERHEAD_OP and r.family == "training" and r.params["workload"] == workload
        assert r.repeats == r.extra["count"] >= 1
        assert 0 < r.extra["p10"] <= r.median_s <= r.extra["p90"] <= r.extra["max"]
        assert r.spread_s >= 0
        # A gap or a dispatch lies inside one step: never longer than the step itself.
        assert r.median_s < r.extra["step_s"] and r.extra["max"] < r.extra["step_max_s"]
    for kind in kinds:
        pooled = keys[(kind, POOLED)]
        per_op = [r for (k, name), r in keys.items() if k == kind and name != POOLED]
        assert per_op and pooled.repeats == sum(r.repeats for r in per_op)
    return keys


def test_mlp_step_overheads(mlp_rows):
    keys = _check_rows(mlp_rows, "mlp")
    # Two nn.Linear calls per step, each a composite aten::linear (t + addmm below it).
    assert keys[("dispatch", "aten::linear")].repeats == 2 * ITERATIONS
    # addmm / mm carry their GEMM in their own CPU time: not dispatch on CPU.
    assert ("dispatch", "aten::addmm") not in keys and ("dispatch", "aten::mm") not in keys
    # Every top-level op but the first of each step has a gap before it (none were waits here).
    gap = keys[("gap", POOLED)]
    assert gap.extra["dropped_gaps"] == 0
    assert gap.repeats == gap.extra["top_level_ops"] - ITERATIONS


def test_counts_equal_samples():
    """summarise() keeps every sample: per-kind counts equal the extracted samples."""
    step = _mlp_step()
    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
        for _ in range(3):
            with torch.profiler.record_function("overhead_probe_step"):
                step()
    trace = extract_overheads(prof.events())
    assert len(trace.step_s) == 3
    rows = _by_key(summarise(trace, "mlp"))
    for kind in ("gap", "dispatch"):
        samples = [s for s in trace.samples if s.kind == kind]
        assert rows[(kind, POOLED)].repeats == len(samples)
        assert all(0 < s.seconds < max(trace.step_s) for s in samples)
    # With kernels on a GPU an op's own CPU time is never kernel work: every op with children counts.
    as_if_cuda = extract_overheads(prof.events(), cuda=True)
    n_dispatch = sum(s.kind == "dispatch" for s in trace.samples)
    assert sum(s.kind == "dispatch" for s in as_if_cuda.samples) > n_dispatch


def test_dlrm_step_overheads_and_execution_trace(dlrm_run):
    rows, trace_path = dlrm_run
    keys = _check_rows(rows, "dlrm")
    assert not dist.is_initialized(), "the world-of-one group is torn down"
    # FBGEMM and c10d dispatcher ops are top-level ops too (else their run time would be a gap).
    names = {name for _, name in keys}
    assert any(n.startswith("fbgemm::") for n in names) and any(n.startswith("c10d::") for n in names)
    et = json.loads(trace_path.read_text())
    assert et["nodes"] and any(n["name"].startswith("aten::") for n in et["nodes"])


def test_local_process_group_leaves_an_existing_group_alone():
    with local_process_group() as created:
        assert created and dist.get_world_size() == 1
        with local_process_group() as nested:
            assert not nested and dist.is_initialized()
        assert dist.is_initialized()
    assert not dist.is_initialized()


def test_overhead_model_round_trip_and_fallback(mlp_rows):
    model = OverheadModel().fit(mlp_rows)
    again = OpModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert isinstance(again, OverheadModel)
    for r in mlp_rows:
        p = {"kind": r.params["kind"], "aten_op": r.params["aten_op"]}
        assert model.predict(p) == again.predict(p) == r.median_s
        assert model.quantiles(p) == again.quantiles(p)
        assert model.out_of_range(p) == []
    unseen = {"kind": "dispatch", "aten_op": "aten::never_called"}
    assert model.predict(unseen) == model.predict({"kind": "dispatch", "aten_op": POOLED})
    assert model.quantiles(unseen)["aten_op"] == POOLED
    assert "never measured" in model.out_of_range(unseen)[0]
    assert model.out_of_range({"kind": "launch", "aten_op": "aten::mm"}), "no launches on CPU"
    with pytest.raises(KeyError, match="launch"):
        model.predict({"kind": "launch", "aten_op": "aten::mm"})


def _row(kind, name, p10, p50, p90, count):
    return Measurement(
        CPU_OVERHEAD_OP,
        {"kind": kind, "aten_op": name, "workload": "x"},
        p50,
        0.0,
        count,
        family="training",
        extra={"p10": p10, "p90": p90, "count": count},
    )


def test_pooling_is_count_weighted_median():
    # The long probe (100 samples) outweighs two short ones that agree with each other.
    rows = [
        _row("gap", "aten::mm", 1e-6, 2e-6, 3e-6, 10),
        _row("gap", "aten::mm", 5e-6, 9e-6, 20e-6, 100),
        _row("gap", "aten::mm", 1.5e-6, 2.5e-6, 4e-6, 10),
    ]
    model = OverheadModel().fit(rows)
    q = model.quantiles({"kind": "gap", "aten_op": "aten::mm"})
    assert q == {"p10": 5e-6, "p50": 9e-6, "p90": 20e-6, "count": 120, "kind": "gap", "aten_op": "aten::mm"}
    # With equal counts the middle row wins.
    rows[1] = _row("gap", "aten::mm", 5e-6, 9e-6, 20e-6, 10)
    assert OverheadModel().fit(rows).predict({"kind": "gap", "aten_op": "aten::mm"}) == 2.5e-6
    # Without '*' rows the kind's fallback is pooled from its ops.
    assert model.quantiles({"kind": "gap", "aten_op": "aten::x"})["count"] == 120
    assert weighted_median([3.0, 1.0, 2.0], [1, 1, 10]) == 2.0

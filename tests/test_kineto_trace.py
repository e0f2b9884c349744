"""Users' own torch.profiler traces: read into step records, rebuilt as an execution graph that
reproduces the traced step, and priced by a bundle (only what it models; the rest as traced)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from kineto_traces import write_mlp_trace

from predictors.kineto_trace import MARKS, TraceError, common_steps, load_traces, price_graph, steps_for
from predictors.simulator import simulate
from predictors.trace_graph import graph_from_traces


@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory):
    directory = tmp_path_factory.mktemp("kineto")
    write_mlp_trace(directory)
    return directory


def test_a_users_trace_becomes_step_records(mlp_trace):
    (trace,) = load_traces(mlp_trace)
    assert (trace.rank, trace.world_size) == (0, 1)
    numbers = common_steps([trace])
    assert len(numbers) == 2  # the active steps
    (step,) = steps_for([trace], numbers[-1])
    names = [o["name"] for o in step["ops"]]
    assert "aten::linear" in names and "c10d::allreduce_" in names and "aten::relu" in names
    linear = next(o for o in step["ops"] if o["name"] == "aten::linear")
    assert linear["shapes"][:2] == [[32, 64], [128, 64]]
    allreduce = next(o for o in step["ops"] if o["name"] == "c10d::allreduce_")
    assert allreduce["bytes"] == 4 * (64 * 128 + 128 + 128 * 10 + 10)  # DDP's one flat bucket, float32
    assert [c["name"] for c in step["comm"]] == ["gloo:all_reduce"]
    assert all(0 <= o["start_s"] <= o["end_s"] <= step["step_s"] + 1e-6 for o in step["ops"])


def test_a_work_item_closed_after_its_step_stays_in_that_step(tmp_path, mlp_trace):
    # gloo completes a work's future before closing its profiler range: on a busy host the
    # range can close after the step that waited on it has ended.
    data = json.loads(next(mlp_trace.glob("*.json")).read_text())
    (trace,) = load_traces(mlp_trace)
    last = common_steps([trace])[-1]
    window = next(e for e in data["traceEvents"] if e.get("name") == f"ProfilerStep#{last}")
    end = window["ts"] + window["dur"]
    work = next(
        e
        for e in data["traceEvents"]
        if str(e.get("name", "")).startswith("gloo:all_reduce") and window["ts"] <= e["ts"] <= end
    )
    work["dur"] = end - work["ts"] + 400.0
    (tmp_path / "late.json").write_text(json.dumps(data))
    (step,) = steps_for(load_traces(tmp_path), last)
    assert [c["name"] for c in step["comm"]] == ["gloo:all_reduce"]
    assert step["comm"][0]["end_s"] == pytest.approx(step["step_s"])


def test_the_rebuilt_graph_holds_every_traced_op_as_traced(mlp_trace):
    # How closely the replay matches the traced step is a figure (benchmarks/trace_prediction.py):
    # on a busy host the backend thread's late start of a collective is not in any op.
    traces = load_traces(mlp_trace)
    steps = steps_for(traces, common_steps(traces)[-1])
    graph = graph_from_traces(steps, [t.host for t in traces])
    traced = [(o["name"], o["end_s"] - o["start_s"]) for o in steps[0]["ops"]]
    rebuilt = [(o.name, o.duration_s) for o in graph.ranks[0] if o.kind != "collective" and o.name not in MARKS]
    assert [n for n, _ in rebuilt] == [n for n, _ in traced]
    assert all(d == pytest.approx(t) for (_, d), (_, t) in zip(rebuilt, traced))
    assert sum(1 for o in graph.ranks[0] if o.kind == "collective") == len(steps[0]["comm"]) == 1
    replay = simulate(graph, lambda op: 0.0, synchronous=True, share_links=False).iteration_s
    assert replay >= sum(t for _, t in traced)  # a replay never runs the traced work in less time


class _Bundle(SimpleNamespace):
    """What price_graph uses of a PerformanceModel: models, predict_params, in_step."""

    def predict_params(self, op, params):
        return self.prices[op]


def test_pricing_replaces_what_the_bundle_models_and_keeps_the_rest(mlp_trace):
    traces = load_traces(mlp_trace)
    steps = steps_for(traces, common_steps(traces)[-1])
    graph = graph_from_traces(steps)
    bundle = _Bundle(models={"gemm": 1, "relu": 1}, prices={"gemm": 1.0, "relu": 2.0}, in_step=None)
    priced = price_graph(graph, bundle)
    by_name = {}
    for before, after in zip(graph.ranks[0], priced.graph.ranks[0]):
        by_name.setdefault(before.name, []).append((before.duration_s, after.duration_s))
    assert all(a == 1.0 for _, a in by_name["aten::linear"]) and all(a == 2.0 for _, a in by_name["aten::relu"])
    assert all(a == b for b, a in by_name["aten::cross_entropy_loss"])  # not modelled: as traced
    assert "aten::cross_entropy_loss" in priced.unpriced and "aten::linear" not in priced.unpriced
    assert 0 < priced.priced_share < 1
    # the priced work is in the replay: two linears at 1 s and a relu at 2 s (seconds, far above
    # anything the trace itself holds)
    assert simulate(priced.graph, lambda op: 0.0, synchronous=True, share_links=False).iteration_s >= 4.0


def _two_ranks(tmp_path, mlp_trace):
    data = json.loads(next(mlp_trace.glob("*.json")).read_text())
    for rank in (0, 1):
        copy_ = copy.deepcopy(data)
        copy_["distributedInfo"] = {**copy_["distributedInfo"], "rank": rank, "world_size": 2}
        (tmp_path / f"r{rank}.json").write_text(json.dumps(copy_))
    return tmp_path


def test_a_collective_is_priced_from_its_launching_message(tmp_path, mlp_trace):
    traces = load_traces(_two_ranks(tmp_path, mlp_trace))
    assert [t.rank for t in traces] == [0, 1]
    steps = steps_for(traces, common_steps(traces)[-1])
    graph = graph_from_traces(steps)
    seen = []

    class Bundle(_Bundle):
        def predict_params(self, op, params):
            seen.append(params)
            return 5e-3

    priced = price_graph(graph, Bundle(models={"all_reduce": 1}, in_step=None))
    collectives = [o for o in priced.graph.ranks[0] if o.kind == "collective"]
    assert [o.duration_s for o in collectives] == [5e-3]
    assert seen[0] == {"op": "all_reduce", "bytes": 4 * 9610, "world": 2, "scope": "intra"}


def test_traces_that_are_not_one_job_are_refused(tmp_path, mlp_trace):
    with pytest.raises(TraceError, match="no Kineto traces"):
        load_traces(tmp_path)
    for name in ("a.json", "b.json"):  # two files, both rank 0
        (tmp_path / name).write_text(next(mlp_trace.glob("*.json")).read_text())
    with pytest.raises(TraceError, match="one trace per rank"):
        load_traces(tmp_path)
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(TraceError, match="not a readable Kineto JSON"):
        load_traces(tmp_path)


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--trace", ".", "--job", "j.yaml"], "--trace"),
        (["--step", "3", "--job", "j.yaml", "--plan", "p.json"], "--step"),
        (["--trace", "no/such/dir"], "--trace"),
        (["--json"], "--job"),
    ],
)
def test_predict_refuses_a_mixed_or_incomplete_request(argv, field, capsys):
    from orchestrator.cli import predict

    assert predict.main([*argv, "--json"]) == 2
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert error["field"] == field

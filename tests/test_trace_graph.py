import pytest

from predictors.simulator import simulate
from predictors.trace_graph import RESUME, STEP_END, graph_from_traces, measured_iteration_s
from probes.vocabulary.in_context import model_op_for
from probes.vocabulary.ops import gemm_params_from_shapes


def _op(name, start_ms, end_ms, shapes=()):
    return {"name": name, "start_s": start_ms * 1e-3, "end_s": end_ms * 1e-3, "shapes": list(shapes)}


def _trace(arrive_ms, comm_start_ms):
    """Compute until `arrive_ms`, launch an all-to-all, wait for it (ends at 3.6 ms on both
    ranks: the late rank arrives at 3.1 and the transfer takes 0.5), then 1 ms more."""
    return {
        "step_s": 4.65e-3,
        "ops": [
            _op("aten::mm", 0.0, arrive_ms, [[64, 32], [32, 16]]),
            _op("c10d::alltoall_base_", arrive_ms, arrive_ms + 0.1),
            _op("aten::relu", 3.65, 4.65),
        ],
        "comm": [{"name": "gloo:all_to_all", "start_s": comm_start_ms * 1e-3, "end_s": 3.6e-3}],
    }


def test_imported_two_rank_trace_rebuilds_the_waiting():
    graph = graph_from_traces([_trace(1.0, 1.1), _trace(3.0, 3.1)])
    early = graph.ranks[0]
    assert [o.name for o in early] == [
        "aten::mm",
        "c10d::alltoall_base_",
        "gloo:all_to_all",
        RESUME,
        "aten::relu",
        STEP_END,
    ]
    coll = early[2]
    # The transfer alone: the late rank's 0.5 ms, not the early rank's 2.5 ms of waiting.
    assert coll.kind == "collective" and coll.duration_s == pytest.approx(0.5e-3) and coll.group == (0, 1)
    assert coll.blocking is False and coll.deps == [1]
    # blocked in wait, then a 50 µs wake-up before the relu
    assert early[3].deps == [2] and early[3].duration_s == pytest.approx(0.05e-3)
    assert early[4].deps == [3] and early[4].issue_s == 0.0
    sim = simulate(graph, cost=lambda op: 0.0)
    # By hand: the collective runs 3.1-3.6 ms (last arrival), the wake-up 3.6-3.65, relu
    # 3.65-4.65 on both ranks: the measured 4.65 ms exactly.
    assert sim.iteration_s == pytest.approx(4.65e-3)
    assert sim.ranks[0].waiting_s == pytest.approx(2.0e-3) and sim.ranks[1].waiting_s == pytest.approx(0.0)


def test_start_offsets_and_the_tail_after_the_last_op():
    early, late = _trace(1.0, 1.1), _trace(3.0, 3.1)
    early["step_s"] = late["step_s"] = 5.0e-3  # 0.35 ms of Python after the relu
    early["start_clock_s"], late["start_clock_s"] = 100.0, 100.0 + 0.5e-3  # rank 1 left the barrier late
    # Different hosts: clocks are not comparable, both start at 0.
    sim = simulate(graph_from_traces([early, late], hosts=["a", "b"]), cost=lambda op: 0.0)
    assert sim.iteration_s == pytest.approx(5.0e-3)
    assert measured_iteration_s([early, late], ["a", "b"]) == pytest.approx(5.0e-3)
    # One host: rank 1 starts 0.5 ms late, arrives at 3.6, the transfer ends at 4.1, then
    # 0.05 wake-up + 1 ms relu + 0.35 ms tail: 5.5 ms, the wall span the ranks really took.
    sim = simulate(graph_from_traces([early, late], hosts=["a", "a"]), cost=lambda op: 0.0)
    assert sim.iteration_s == pytest.approx(5.5e-3)
    assert measured_iteration_s([early, late], ["a", "a"]) == pytest.approx(5.5e-3)


def test_mismatched_collective_counts_are_an_error():
    bad = _trace(3.0, 3.1)
    bad["comm"] = []
    with pytest.raises(ValueError, match="different numbers of collectives"):
        graph_from_traces([_trace(1.0, 1.1), bad])


def test_gemm_shapes_from_recorded_inputs():
    assert gemm_params_from_shapes("aten::linear", [[256, 800], [128, 800], [128]]) == (256, 128, 800, "addmm", 1)
    assert gemm_params_from_shapes("aten::mm", [[256, 64], [64, 13]]) == (256, 13, 64, "mm", 1)
    assert gemm_params_from_shapes("aten::bmm", [[8, 32, 16], [8, 16, 32]]) == (32, 32, 16, "bmm", 8)
    assert gemm_params_from_shapes("aten::relu", [[4, 4]]) is None


def test_traced_ops_map_to_the_isolated_probe_ops():
    op, params = model_op_for("aten::linear", [[256, 800], [128, 800], [128]])
    assert op == "gemm" and (params["M"], params["N"], params["K"], params["variant"]) == (256, 128, 800, "addmm")
    op, params = model_op_for("aten::gelu", [[2, 128, 256]])
    assert op == "gelu" and (params["rows"], params["cols"]) == (256, 256)
    assert model_op_for("aten::mul", [[256], []]) is None  # by a scalar: not the probed form
    assert model_op_for("aten::view", [[4, 4]]) is None

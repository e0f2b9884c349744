"""The network model, the chunk simulator (baseline and Themis schedules) and the chunk policy."""

from __future__ import annotations

import math

import pytest

from policies.chunking import choose_chunking
from predictors.chunk_sim import SCHEDULES, ChunkSimError, chunk_orders, simulate_all_reduce
from predictors.network import PAPER_TOPOLOGIES, Dimension, NetworkError, NetworkTopology, dimension_from_model, preset
from probes.vocabulary.chunks import ChunkSchedule, ScheduleError

MB = 2**20


def worked_example() -> tuple[NetworkTopology, float]:
    """The paper's Sec 3.3 example: 4x4 peers, dim2 at half dim1's bandwidth, no latency.
    Returns the topology and its time unit: a 64 MB reduce-scatter on dim1."""
    topology = NetworkTopology(
        "example", (Dimension(4, 200.0, 0.0, "ring", "dim1"), Dimension(4, 100.0, 0.0, "ring", "dim2"))
    )
    return topology, topology.dims[0].stage_seconds(64 * MB)


def timeline(result, dim: int, unit: float) -> list[tuple[int, str, float, float]]:
    return [
        (p.chunk + 1, p.kind, round(p.start_s / unit, 6), round(p.end_s / unit, 6))
        for p in result.phases
        if p.dim == dim
    ]


def phases(text: str) -> list[tuple[int, str, float, float]]:
    """A dimension's timeline written as "chunk kind start end; ...", times in units."""
    return [(int(c), k, float(a), float(b)) for c, k, a, b in (part.split() for part in text.split(";"))]


@pytest.mark.parametrize(
    "schedule, orders, units, dim1, dim2, utilization",
    [
        # Baseline: eight units, dim2 idle at both ends. dim1 runs the four 64 MB reduce-scatters,
        # then the four all-gathers, back to back; dim2 each chunk's 16 MB all-reduce
        # (0.5 + 0.5 units), busy only over [1, 5].
        (
            "baseline",
            None,
            8.0,
            phases("1 rs 0 1; 2 rs 1 2; 3 rs 2 3; 4 rs 3 4; 1 ag 4 5; 2 ag 5 6; 3 ag 6 7; 4 ag 7 8"),
            phases("1 ar 1 2; 2 ar 2 3; 3 ar 3 4; 4 ar 4 5"),
            (2 * 1.0 + 1 * 0.5) / 3,
        ),
        # Themis sends chunk two through dim2 first and takes seven units. Load tracker: chunk 1
        # takes the baseline order (loads equal), leaving dim1 = 2, dim2 = 1 units; chunk 2 then
        # starts on the less loaded dim2, after which dim1 is least loaded again.
        # The paper's Fig 5b: dim1 runs C1.1, C3.1, C2.2+C2.3, C4.1, C1.4, C3.4, C4.4 and idles at
        # the end; dim2 runs C2.1 (2 units), the all-reduces of C1, C3, C4, then C2.4 (2 units),
        # ending at 7.
        (
            "themis_scf",
            [[0, 1], [1, 0], [0, 1], [0, 1]],
            7.0,
            phases("1 rs 0 1; 3 rs 1 2; 2 ar 2 2.5; 4 rs 2.5 3.5; 1 ag 3.5 4.5; 3 ag 4.5 5.5; 4 ag 5.5 6.5"),
            phases("2 rs 0 2; 1 ar 2 3; 3 ar 3 4; 4 ar 4 5; 2 ag 5 7"),
            (2 * 6.5 / 7 + 1) / 3,
        ),
    ],
)
def test_worked_example_timelines(schedule, orders, units, dim1, dim2, utilization):
    topology, unit = worked_example()
    if orders is not None:
        assert chunk_orders(topology, 4, 64 * MB, schedule) == orders
    r = simulate_all_reduce(topology, 256 * MB, 4, schedule, keep_phases=True)
    assert r.time_s / unit == pytest.approx(units)
    assert timeline(r, 0, unit) == dim1
    assert timeline(r, 1, unit) == dim2
    assert r.utilization == pytest.approx(utilization)


def test_one_dimension_ring_matches_the_closed_form_and_schedules_agree():
    dim = Dimension(8, 50.0, 2.0, "ring")
    topology = NetworkTopology("ring8", (dim,))
    size = 64 * MB
    expected = 2 * (7 * 2e-6 + 7 / 8 * size / 50e9)  # reduce-scatter + all-gather, one chunk
    for schedule in SCHEDULES:
        assert simulate_all_reduce(topology, size, 1, schedule).time_s == pytest.approx(expected)
    assert Dimension(8, 50.0, 2.0, "direct").steps == 1 and Dimension(8, 50.0, 2.0, "switch").steps == 3


def test_every_chunk_reduce_scatters_through_all_dimensions_before_gathering():
    topology = preset("4D-Ring_FC_Ring_SW")
    r = simulate_all_reduce(topology, 200e6, 16, "themis_scf", keep_phases=True)
    per_chunk: dict[int, list] = {}
    for p in sorted(r.phases, key=lambda p: (p.chunk, p.index)):
        per_chunk.setdefault(p.chunk, []).append(p)
    for phases in per_chunk.values():
        kinds = [p.kind for p in phases]
        assert kinds == ["rs", "rs", "rs", "ar", "ag", "ag", "ag"]
        assert all(a.end_s <= b.start_s + 1e-15 for a, b in zip(phases, phases[1:]))
        assert sorted(p.dim for p in phases[:4]) == [0, 1, 2, 3]
    # Bytes on every dimension add up to what the chunk orders imply, and no dimension exceeds
    # its bandwidth.
    assert all(0 < u <= 1 + 1e-9 for u in r.dim_utilization)
    assert 0 < r.utilization <= 1 + 1e-9


def test_simulation_is_deterministic():
    # (its speed is measured by benchmarks/themis_reproduction.py, not asserted here)
    topology = preset("4D-Ring_FC_Ring_SW")
    a = simulate_all_reduce(topology, 1e9, 64, "themis_scf")
    b = simulate_all_reduce(topology, 1e9, 64, "themis_scf")
    assert a.to_dict() == b.to_dict()


def test_themis_beats_the_baseline_where_the_baseline_is_unbalanced():
    for name in PAPER_TOPOLOGIES:
        topology = preset(name)
        base = simulate_all_reduce(topology, 1e9, 64, "baseline")
        scf = simulate_all_reduce(topology, 1e9, 64, "themis_scf")
        assert scf.time_s < base.time_s and scf.utilization > base.utilization, name


def test_balanced_network_leaves_nothing_for_themis():
    # BW(dim1) = P1 x BW(dim2): the baseline order already loads both dimensions equally.
    topology = NetworkTopology("balanced", (Dimension(4, 400.0, 0.0, "ring"), Dimension(4, 100.0, 0.0, "ring")))
    base = simulate_all_reduce(topology, 512 * MB, 32, "baseline")
    themis = simulate_all_reduce(topology, 512 * MB, 32, "themis_fifo")
    assert themis.time_s >= base.time_s * (1 - 1e-9)
    assert chunk_orders(topology, 32, 16 * MB, "themis_fifo") == [[0, 1]] * 32


def test_bad_inputs_are_refused_with_the_argument_named():
    topology, _ = worked_example()
    with pytest.raises(ChunkSimError, match="schedule must be one of"):
        simulate_all_reduce(topology, 1e6, 4, "round_robin")
    with pytest.raises(ChunkSimError, match="chunks"):
        simulate_all_reduce(topology, 1e6, 0)
    with pytest.raises(NetworkError, match="algorithm must be one of ring, direct, switch"):
        Dimension(4, 10.0, 1.0, "torus")
    with pytest.raises(NetworkError, match=r"dims\[1\] has unknown fields \['bw'\]"):
        NetworkTopology.from_dict({"dims": [{"peers": 2, "bandwidth_gbps": 1, "latency_us": 1}, {"peers": 2, "bw": 1}]})
    with pytest.raises(NetworkError, match="unknown topology 'nope'; presets: 2D-SW_SW"):
        preset("nope")


def test_presets_and_round_trip():
    for name in PAPER_TOPOLOGIES:
        topology = preset(name)
        assert topology.npus == 1024
        assert NetworkTopology.from_dict(topology.to_dict()) == topology
    h100 = preset("dgx-h100-400gx16")
    assert h100.peers == (8, 16) and h100.dims[1].bandwidth_gbps == pytest.approx(50.0)


def test_dimension_calibrated_from_a_measured_curve():
    class Linear:  # a measured reduce-scatter curve: 30 us + bytes sent / 2 GB/s
        def predict(self, op, strict=False, **params):
            assert op == "reduce_scatter" and params["world"] == 4 and params["scope"] == "inter"
            return 30e-6 + 0.75 * params["bytes"] / 2e9

    dim = dimension_from_model(Linear(), 4, "inter")
    assert dim.bandwidth_gbps == pytest.approx(2.0)
    assert dim.latency_s() == pytest.approx(30e-6)
    assert dim.algorithm == "ring" and dim.peers == 4


def test_policy_sweeps_chunks_and_returns_an_executable_schedule():
    topology = preset("dgx-h100-400gx16")
    decision = choose_chunking(topology, 25 * MB)
    assert len(decision.candidates) == 3 * 10
    times = [c.predicted_ms for c in decision.candidates]
    ranked = [round(t, 9) for t in times]  # times equal to 1e-9 ms are ties (`ChunkingPolicy.choose`)
    assert ranked == sorted(ranked) and decision.predicted_ms == times[0]
    by = {(c.detail["schedule"], c.detail["chunks"]): c.predicted_ms for c in decision.candidates}
    # Per-chunk latency makes hundreds of chunks slower than a few: the trade-off is real.
    assert by[("baseline", 512)] > 2 * by[("baseline", decision.choice_detail["chunks"])]
    schedule = ChunkSchedule.from_dict(decision.choice_detail["chunk_schedule"])
    assert schedule.dims == (8, 16) and schedule.chunks == decision.choice_detail["chunks"]

    unbalanced = choose_chunking(preset("3D-SW_SW_SW_homo"), 1e9)
    assert unbalanced.choice_detail["schedule"] != "baseline"
    assert unbalanced.choice_detail["best_baseline"]["speedup"] > 2.0


def test_chunk_schedule_validation():
    with pytest.raises(ScheduleError, match="not a permutation"):
        ChunkSchedule(dims=(2, 2), orders=((0, 0),))
    with pytest.raises(ScheduleError, match="out of sequence"):
        ChunkSchedule(dims=(2, 2), orders=((0, 1),), issue=((0, 1), (0, 0), (0, 2), (0, 3)))
    s = ChunkSchedule.baseline((2, 2), 3)
    assert len(s.issue) == 12 and ChunkSchedule.from_dict(s.to_dict()) == s
    assert s.stage_dim(0, 0) == (0, "rs") and s.stage_dim(0, 3) == (0, "ag")
    assert math.prod(s.dims) == s.world_size == 4

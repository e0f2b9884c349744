"""The critical-path simulator on hand-built two-rank graphs, answers worked out by hand."""

import json

import pytest

from predictors.graph import ExecutionGraph, GraphOp
from predictors.simulator import DeadlockError, simulate

MS = 1e-3


def comp(name, ms, deps=()):
    return GraphOp(name, "compute", "t", {"ms": ms}, deps=list(deps))


def coll(name, ms, group=(0, 1), deps=()):
    return GraphOp(name, "collective", "t", {"ms": ms}, stream="comm", group=group, deps=list(deps))


def cost(op):
    return op.params["ms"] * MS


def test_inter_rank_synchronisation_at_a_collective():
    # rank 0: A 3 ms, all-reduce C 2 ms, E 1 ms.  rank 1: B 1 ms, C, D 4 ms.
    # C cannot start before rank 0 arrives at 3 ms: both end it at 5; rank 1 waited 2 ms.
    # Rank 1 then runs D 5..9, rank 0 E 5..6: the iteration is 9 ms, where per-rank sums
    # (6 and 7 ms) would say 7.
    g = ExecutionGraph(
        [
            [comp("A", 3), coll("C", 2, deps=[0]), comp("E", 1, deps=[1])],
            [comp("B", 1), coll("C", 2, deps=[0]), comp("D", 4, deps=[1])],
        ]
    )
    res = simulate(g, cost, synchronous=True)
    assert res.iteration_s == pytest.approx(9 * MS)
    assert res.spans[1][1] == pytest.approx((3 * MS, 5 * MS))
    assert res.spans[0][1] == pytest.approx((3 * MS, 5 * MS))
    assert res.ranks[1].waiting_s == pytest.approx(2 * MS) and res.ranks[0].waiting_s == pytest.approx(0)
    assert [(r, name) for r, _, name in res.critical_path] == [(0, "A"), (0, "C"), (1, "C"), (1, "D")]


def test_intra_rank_synchronisation_and_overlap_on_an_asynchronous_device():
    # Per rank: X 2 ms; all-to-all Y 3 ms on the comm stream, needs X; Z 1 ms independent;
    # W 1 ms needs Y.  X 0..2, Y 2..5 (comm), Z 2..3 (overlaps Y), W waits for Y: 5..6.
    ops = lambda: [comp("X", 2), coll("Y", 3, deps=[0]), comp("Z", 1), comp("W", 1, deps=[1])]  # noqa: E731
    g = ExecutionGraph([ops(), ops()])
    res = simulate(g, cost)
    assert res.iteration_s == pytest.approx(6 * MS)
    assert res.spans[0][2] == pytest.approx((2 * MS, 3 * MS))
    assert res.spans[0][3] == pytest.approx((5 * MS, 6 * MS))
    assert res.ranks[0].busy_s["compute"] == pytest.approx(4 * MS)
    assert res.ranks[0].busy_s["comm"] == pytest.approx(3 * MS)
    assert res.ranks[0].exposed_comm_s == pytest.approx(2 * MS)  # Z hides 1 of Y's 3 ms
    # The same graph on a synchronous device (a CPU with gloo) overlaps nothing: 2+3+1+1.
    assert simulate(g, cost, synchronous=True).iteration_s == pytest.approx(7 * MS)


def test_cpu_issue_overhead_delays_kernels_and_can_be_the_bottleneck():
    # 4 tiny kernels of 0.1 ms, each costing 1 ms of CPU to issue: the device idles and the
    # iteration is the CPU's 4 ms + the last kernel's 0.1 ms.
    g = ExecutionGraph([[comp(f"k{i}", 0.1) for i in range(4)]])
    res = simulate(g, cost, cpu_overhead=lambda op: 1 * MS)
    assert res.iteration_s == pytest.approx(4.1 * MS)
    assert res.spans[0][0] == pytest.approx((1 * MS, 1.1 * MS))


def test_subgroup_collectives_only_wait_for_their_members():
    # Rank 2 is slow (5 ms) but only ranks 0 and 1 share the all-reduce: it ends at 1 + 2.
    g = ExecutionGraph(
        [[comp("a", 1), coll("ar", 2, group=(0, 1))], [comp("b", 1), coll("ar", 2, group=(0, 1))], [comp("slow", 5)]]
    )
    res = simulate(g, cost, synchronous=True)
    assert res.spans[0][1] == pytest.approx((1 * MS, 3 * MS))
    assert res.iteration_s == pytest.approx(5 * MS)


def test_mismatched_collectives_deadlock_with_a_clear_error():
    g = ExecutionGraph(
        [
            [coll("c1", 1, group=(0, 1)), coll("c2", 1, group=(0, 2))],
            [coll("c3", 1, group=(1, 2)), coll("c1", 1, group=(0, 1))],
            [coll("c2", 1, group=(0, 2)), coll("c3", 1, group=(1, 2))],
        ]
    )
    with pytest.raises(DeadlockError, match="wait at"):
        simulate(g, cost)


def test_graph_validation_and_json_round_trip():
    with pytest.raises(ValueError, match="must name earlier ops"):
        ExecutionGraph([[comp("a", 1, deps=[0])]])
    with pytest.raises(ValueError, match="not in its group"):
        ExecutionGraph([[coll("c", 1, group=(1, 2))], [], []])
    g = ExecutionGraph([[comp("A", 3), coll("C", 2, deps=[0])], [coll("C", 2)]], meta={"job": "x"})
    again = ExecutionGraph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert simulate(again, cost).iteration_s == simulate(g, cost).iteration_s


def test_exposed_communication_matches_a_brute_force_count():
    import numpy as np

    from predictors.graph import GraphOp
    from predictors.simulator import _exposed

    rng = np.random.default_rng(0)
    for _ in range(20):
        ops, spans = [], []
        for _ in range(30):
            start = float(rng.uniform(0, 10))
            spans.append((start, start + float(rng.uniform(0, 2))))
            comm = rng.random() < 0.3
            ops.append(
                GraphOp(
                    "x",
                    "collective" if comm else "compute",
                    "x",
                    stream="comm" if comm else "compute",
                    group=(0,) if comm else (),
                )
            )
        grid = np.linspace(0, 12, 120_001)
        busy = np.zeros_like(grid, dtype=bool)
        for (a, b), o in zip(spans, ops):
            if o.stream == "compute":
                busy |= (grid >= a) & (grid < b)
        step = grid[1] - grid[0]
        expected = sum(
            float(((grid >= a) & (grid < b) & ~busy).sum()) * step
            for (a, b), o in zip(spans, ops)
            if o.stream == "comm"
        )
        assert _exposed(spans, ops) == pytest.approx(expected, abs=1e-3)


def test_concurrent_collectives_share_a_rank_link():
    # Per rank: a DP all-reduce A (4 ms) on "comm", then, 1 ms later on the CPU, a TP
    # all-reduce T (2 ms) on "comm:1", both intra-node. Alone T would run 1..3 ms. Sharing the
    # link fairly, both run at half rate from 1 ms: T's 2 ms of work ends at 5, A's remaining
    # 3 ms at 6. The simulator queues T behind A (4..6): the same 6 ms makespan, and nothing
    # already placed moves. An inter-node collective (another link) is not delayed.
    def rank():
        return [
            GraphOp("A", "collective", "t", {"ms": 4, "scope": "intra"}, stream="comm", group=(0, 1)),
            GraphOp("gap", "compute", "t", {"ms": 1}),
            GraphOp("T", "collective", "t", {"ms": 2, "scope": "intra"}, stream="comm:1", group=(0, 1), deps=[1]),
            GraphOp("N", "collective", "t", {"ms": 2, "scope": "inter"}, stream="comm:2", group=(0, 1), deps=[1]),
        ]

    g = ExecutionGraph([rank(), rank()])
    shared = simulate(g, cost)
    assert shared.spans[0][2] == pytest.approx((4 * MS, 6 * MS))
    assert shared.spans[0][3] == pytest.approx((1 * MS, 3 * MS))
    assert shared.iteration_s == pytest.approx(6 * MS)
    assert [name for _, _, name in shared.critical_path][-2:] == ["A", "T"]  # T waited on A's link
    alone = simulate(g, cost, share_links=False)
    assert alone.spans[0][2] == pytest.approx((1 * MS, 3 * MS)) and alone.iteration_s == pytest.approx(4 * MS)


def test_a_posted_send_lets_its_rank_go_on():
    # rank 0: A 2 ms, then posts the send S (1 ms) to rank 1 and runs B 3 ms at once: 2..5.
    # rank 1: C 4 ms, then receives S: 4..5, then D 1 ms: 5..6. Blocking, rank 0 would wait at
    # S until 4 and end at 8.
    def graph(posted: bool) -> ExecutionGraph:
        send = GraphOp("S", "collective", "t", {"ms": 1}, stream="comm:send", group=(0, 1), posted=posted)
        return ExecutionGraph(
            [
                [comp("A", 2), send, comp("B", 3, deps=[0])],
                [comp("C", 4), coll("S", 1, group=(0, 1), deps=[0]), comp("D", 1, deps=[1])],
            ]
        )

    res = simulate(graph(True), cost, synchronous=True)
    assert res.spans[0][2] == pytest.approx((2 * MS, 5 * MS)) and res.spans[0][1] == pytest.approx((4 * MS, 5 * MS))
    assert res.iteration_s == pytest.approx(6 * MS)
    assert simulate(graph(False), cost, synchronous=True).iteration_s == pytest.approx(8 * MS)


def test_two_stage_pipeline_needs_posted_sends():
    # stage 0 sends a1 before receiving g0, stage 1 sends g0 before receiving a1 (1F1B):
    # with blocking sends each waits for the other; posted, both go on
    def graph(posted: bool) -> ExecutionGraph:
        def send(name, group):
            return GraphOp(name, "collective", "t", {"ms": 1}, stream="comm:send", group=group, posted=posted)

        return ExecutionGraph(
            [
                [comp("F0", 1), send("a0", (0, 1)), comp("F1", 1), send("a1", (0, 1)), coll("g0", 1, (1, 0))],
                [coll("a0", 1, (0, 1)), comp("B0", 1), send("g0", (1, 0)), coll("a1", 1, (0, 1))],
            ]
        )

    with pytest.raises(DeadlockError):
        simulate(graph(False), cost, synchronous=True)
    assert simulate(graph(True), cost, synchronous=True).iteration_s > 0


def test_an_unreceived_send_is_an_error():
    send = GraphOp("S", "collective", "t", {"ms": 1}, stream="comm:send", group=(0, 1), posted=True)
    with pytest.raises(DeadlockError, match="never received"):
        simulate(ExecutionGraph([[send], [comp("C", 1)]]), cost)

"""Row-wise, column-wise and data-parallel tables: shards, the graph they build, their memory."""

import pytest

from predictors.dlrm_graph import build_dlrm_graph
from predictors.memory import dlrm_memory
from predictors.simulator import simulate
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.table_shards import ShardingPlanError, exchanged_widths, shard_bytes, table_shards

RW, DP = {"type": "row_wise"}, {"type": "data_parallel"}


def job(dims=(8, 16, 16, 4), world=2, rows=1000, pooling=6, batch=32):
    return JobSpec.from_dict(
        {
            "name": "s",
            "workload": "dlrm",
            "world_size": world,
            "batch_size": batch,
            "dense": {"num_dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
            "tables": [
                {"name": f"t{i}", "num_embeddings": rows + i, "embedding_dim": d, "pooling_factor": pooling}
                for i, d in enumerate(dims)
            ],
        }
    )


def cw(*ranks):
    return {"type": "column_wise", "ranks": list(ranks)}


def test_pieces_of_each_sharding_type():
    spec = job(world=3)
    shards = table_shards(spec, [0, RW, cw(0, 1, 2), DP])

    def by(table: int) -> list[tuple[int, int, int, int]]:
        return [
            (s.rank, s.shape.num_embeddings, s.shape.embedding_dim, s.shape.pooling_factor)
            for s in shards
            if s.table == table
        ]

    assert by(0) == [(0, 1000, 8, 6)]
    assert by(1) == [(0, 334, 16, 2), (1, 334, 16, 2), (2, 333, 16, 2)]  # rows split, a third of the lookups each
    assert by(2) == [(0, 1002, 6, 6), (1, 1002, 5, 6), (2, 1002, 5, 6)]  # 16 columns as 6 + 5 + 5
    assert by(3) == [(r, 1003, 4, 6) for r in range(3)]  # a replica per rank
    # the all-to-all carries table- and column-wise pieces only
    assert exchanged_widths(spec, shards) == [8 + 6, 5, 5]
    assert shard_bytes(shards, 3) == [
        4 * (1000 * 8 + 334 * 16 + 1002 * 6 + 1003 * 4),
        4 * (334 * 16 + 1002 * 5 + 1003 * 4),
        4 * (333 * 16 + 1002 * 5 + 1003 * 4),
    ]


@pytest.mark.parametrize(
    "plan, message",
    [
        ([0, 1, 0], "plan places 3 tables, job has 4"),
        ([0, 2, 0, 1], r"plan\[1\] \(table 't1'\): rank 2 outside 0..1"),
        ([0, {"type": "diagonal"}, 0, 1], r"plan\[1\] \(table 't1'\).type: 'diagonal' is not one of"),
        ([0, {"type": "row_wise", "ranks": [1]}, 0, 1], r"row_wise spans every rank"),
        ([0, cw(0, 0), 0, 1], "must be distinct ranks"),
        ([0, 1, 0, cw(0, 1, 2, 3, 4)], "must be distinct ranks in 0..1"),
        ([0, 1, 0, "1"], "expected a rank or a"),
    ],
)
def test_bad_plans_name_the_entry(plan, message):
    with pytest.raises(ShardingPlanError, match=message):
        table_shards(job(), plan)


def unit_cost(op):
    return 1e-4 if op.params else 0.0


def test_graph_of_a_mixed_plan():
    spec = job()
    g = build_dlrm_graph(spec, [0, RW, cw(0, 1), DP])
    for rank in g.ranks:
        names = [o.name for o in rank]
        assert names[:7] == [
            "embedding_fwd",
            "all_to_all_fwd",
            "reduce_scatter_fwd",
            "exchange_cat",
            "embedding_dp_fwd",
            "embeddings_cat",
            "fc0_fwd",
        ]
        op = {o.name: o for o in rank}
        # every way embeddings arrive is joined into one [B, 24 + 16 + 4] tensor (the received
        # pieces laid side by side first), which the interaction waits for with the bottom MLP
        assert [rank[d].name for d in op["exchange_cat"].deps] == ["all_to_all_fwd"]
        assert sorted(rank[d].name for d in op["embeddings_cat"].deps) == [
            "embedding_dp_fwd",
            "exchange_cat",
            "reduce_scatter_fwd",
        ]
        assert op["exchange_cat"].params["bytes"] == 4 * 32 * 24
        assert op["embeddings_cat"].params["bytes"] == 4 * 32 * (24 + 16 + 4)
        assert sorted(rank[d].name for d in op["interaction_cat"].deps) == ["embeddings_cat", "relu1_fwd"]
        assert {"all_to_all_bwd", "all_gather_bwd", "embedding_dp_bwd", "dp_table_all_reduce"} <= set(names)
        # each backward exchange is sent from contiguous copies of its gradient slice
        assert [rank[d].name for d in op["all_to_all_bwd"].deps] == ["exchange_grad_cat"]
        assert [rank[d].name for d in op["exchange_grad_cat"].deps] == ["exchange_grad_copy"]
        assert op["exchange_grad_copy"].params["bytes"] == op["exchange_grad_cat"].params["bytes"] == 4 * 32 * 24
        assert [rank[d].name for d in op["all_gather_bwd"].deps] == ["row_wise_grad_copy"]
        assert op["row_wise_grad_copy"].params["bytes"] == 4 * 32 * 16
        assert [rank[d].name for d in op["embedding_dp_bwd"].deps] == ["embedding_dp_grad_copy"]
        assert op["embedding_dp_grad_copy"].params["bytes"] == 4 * 32 * 4
        assert sorted(rank[d].name for d in op["embedding_bwd"].deps) == ["all_gather_bwd", "all_to_all_bwd"]
        step = rank[-1]
        assert step.name == "optimizer_step" and "dp_table_all_reduce" in [rank[d].name for d in step.deps]
    rs = next(o for o in g.ranks[0] if o.name == "reduce_scatter_fwd")
    assert rs.params["bytes"] == 4 * 32 * 2 * 16  # the global batch's partial sums of the 16-wide table
    ar = next(o for o in g.ranks[0] if o.name == "dp_table_all_reduce")
    assert ar.params["bytes"] == 4 * 1003 * 4  # the replica's dense gradient
    # rank 0 sends t0 (8) and half of t2 (8): 2 x 32 x 16 floats; both ranks' widths differ
    a2a = next(o for o in g.ranks[0] if o.name == "all_to_all_fwd")
    assert a2a.params["bytes"] == 4 * max(2 * 32 * 16, 32 * 24) and a2a.params["uneven"] is True
    assert simulate(g, unit_cost, synchronous=True).iteration_s > 0


def test_column_wise_on_one_rank_is_table_wise_and_row_wise_only_has_no_all_to_all():
    spec = job()
    tw = build_dlrm_graph(spec, [0, 1, 0, 1])
    one = build_dlrm_graph(spec, [cw(0), 1, 0, cw(1)])
    assert [(o.name, o.params) for o in tw.ranks[0]] == [(o.name, o.params) for o in one.ranks[0]]
    rows = build_dlrm_graph(spec, [RW] * 4)
    names = [o.name for o in rows.ranks[1]]
    assert "all_to_all_fwd" not in names and "reduce_scatter_fwd" in names and "all_gather_bwd" in names


def test_memory_follows_the_pieces():
    spec = job(rows=100_000)
    tw = [dlrm_memory(spec, [0, 0, 0, 0], r) for r in range(2)]
    rw = [dlrm_memory(spec, [RW] * 4, r) for r in range(2)]
    dp = [dlrm_memory(spec, [DP] * 4, r) for r in range(2)]
    all_tables = sum(t.bytes for t in spec.tables)
    assert tw[0].weights - tw[1].weights == all_tables  # everything on rank 0
    assert abs(rw[0].weights - rw[1].weights) < 0.01 * all_tables  # split evenly by rows
    # replicas everywhere, with dense gradients
    assert dp[0].weights == dp[1].weights == tw[0].weights
    assert dp[0].gradients - tw[0].gradients == all_tables


def test_a_bad_plan_is_refused_before_launch_naming_the_entry():
    from orchestrator.launch import launch_dlrm

    with pytest.raises(ShardingPlanError, match=r"plan\[1\].*type"):
        launch_dlrm(job(), [0, {"type": "diagonal"}, 0, 1])

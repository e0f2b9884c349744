"""The DLRM graph builder: structure of one iteration and its simulation."""

import pytest

from predictors.ddp_buckets import ddp_buckets
from predictors.dlrm_graph import all_to_all_bytes, build_dlrm_graph
from predictors.simulator import simulate
from probes.vocabulary.jobspec import JobSpec


def job(bottom=(16, 8), top=(16, 1), tables=3, world=2):
    return JobSpec.from_dict(
        {
            "name": "g",
            "workload": "dlrm",
            "world_size": world,
            "batch_size": 32,
            "dense": {"num_dense_features": 4, "bottom_mlp": list(bottom), "top_mlp": list(top)},
            "tables": [
                {"name": f"t{i}", "num_embeddings": 1000, "embedding_dim": 8, "pooling_factor": 2}
                for i in range(tables)
            ],
        }
    )


def unit_cost(op):
    return {"embedding_fwd": 5e-3, "embedding_bwd": 5e-3}.get(op.op, 1e-4)


def test_graph_mirrors_the_workload_op_for_op():
    spec = job()
    g = build_dlrm_graph(spec, [0, 0, 1])
    names = [o.name for o in g.ranks[0]]
    assert names[:2] == ["embedding_fwd", "all_to_all_fwd"]
    assert names.index("interaction_cat") == names.index("relu1_fwd") + 1  # after the bottom MLP
    # the embeddings' gradient goes back after the bottom MLP's backward and DDP's all-reduces
    # (autograd reaches the lookups' nodes last: they were made before the bottom MLP ran)
    assert names.index("all_to_all_bwd") > names.index("fc0_grad_weight")
    last_reduce = max(i for i, n in enumerate(names) if n.startswith("ddp_all_reduce"))
    assert names.index("all_to_all_bwd") > last_reduce
    buckets = ddp_buckets(4 * sum(i * o + o for i, o in spec.dense_layers()))
    assert sum(n.startswith("ddp_all_reduce") for n in names) == len(buckets)
    # DDP copies each layer's gradients into its bucket before the bucket's all-reduce, and the
    # reduced buckets back into the gradients once the backward is done
    op = {o.name: o for o in g.ranks[0]}
    for li, (fan_in, fan_out) in enumerate(spec.dense_layers()):
        copy = op[f"fc{li}_bucket_copy"]
        assert copy.op == "memcpy" and copy.params["bytes"] == 4 * (fan_in * fan_out + fan_out)
        assert [g.ranks[0][d].name for d in copy.deps] == [f"fc{li}_grad_weight"]
    back = [f"ddp_grad_copy{i}" for i in range(len(buckets))]
    assert names[-4 - len(back) :] == ["exchange_grad_cat", "all_to_all_bwd", "embedding_bwd", *back, "optimizer_step"]
    assert [op[n].params["bytes"] for n in back] == buckets
    assert [g.ranks[0][d].name for d in op["optimizer_step"].deps] == back
    # rank 0 sends 2 ranks x 32 x 16 floats; receives 32 x 24: the larger is the message
    assert all_to_all_bytes(spec, [0, 0, 1]) == 4 * max(2 * 32 * 16, 32 * 24)
    # unequal pooled widths per rank: the all-to-all is priced on the uneven curve
    a2a = next(o for o in g.ranks[0] if o.name == "all_to_all_fwd")
    assert a2a.params["uneven"] is True
    even = build_dlrm_graph(job(tables=2), [0, 1])
    assert "uneven" not in next(o for o in even.ranks[0] if o.name == "all_to_all_fwd").params


def test_a_rank_without_tables_waits_for_the_one_with_them():
    g = build_dlrm_graph(job(), [0, 0, 0])
    assert "embedding_fwd" not in [o.name for o in g.ranks[1]]
    res = simulate(g, unit_cost, synchronous=True)
    # rank 1 idles at the forward all-to-all for rank 0's 5 ms lookup. The DDP all-reduce was
    # issued before the embedding backward (autograd runs the TBE node last), so rank 1 does
    # not wait for that; the iteration ends with rank 0's embedding backward.
    assert res.ranks[1].waiting_s == pytest.approx(5e-3, rel=0.05)
    assert res.iteration_s == pytest.approx(res.ranks[0].end_s) and res.ranks[0].end_s > res.ranks[1].end_s + 4e-3
    assert "embedding_fwd" in [name for _, _, name in res.critical_path]
    balanced = simulate(build_dlrm_graph(job(), [0, 1, 1]), unit_cost, synchronous=True)
    assert balanced.iteration_s == pytest.approx(res.iteration_s, rel=0.01)  # one table set each: same lookups cost
    assert balanced.ranks[1].waiting_s < 1e-3


def test_ddp_buckets_first_small_then_capped():
    assert ddp_buckets(60 * 2**20) == [2**20, 25 * 2**20, 25 * 2**20, 9 * 2**20]
    assert ddp_buckets(1000) == [1000]


def test_graph_ops_are_priced_by_a_fitted_bundle(tmp_path):
    """Every op the builder emits names a modelled op with params its model accepts."""
    from predictors.fit import fit_performance_model
    from predictors.simulator import model_cost
    from probes.vocabulary.records import Measurement

    spec = job()
    graph = build_dlrm_graph(spec, [0, 0, 1])
    rows = []
    for i, o in enumerate(o for ops in graph.ranks for o in ops):
        for k in range(12):  # enough rows per op to fit; times grow with the op's bytes
            p = dict(o.params)
            if "bytes" in p:
                p["bytes"] = float(p["bytes"]) * (1 + k)
            rows.append(Measurement(o.op, p, 1e-5 * (1 + k) * (1 + i % 3), 0.0, 5))
    # two judge folds, not five: the models fitted on every row are the same (the folds only
    # score them), and what is tested is that those models price every op
    model, _ = fit_performance_model(rows, "hw", folds=2)
    cost = model_cost(model)
    assert all(cost(o) > 0 for ops in graph.ranks for o in ops)

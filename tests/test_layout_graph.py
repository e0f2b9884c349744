"""The transformer's execution graph under every layout: the ops the real job issues per
micro-batch, stage and data-parallel scheme, and a simulation that meets at every transfer."""

from __future__ import annotations

import pytest

from predictors.simulator import simulate
from predictors.transformer_graph import block_param_numel, build_transformer_graph, one_f_one_b, stage_param_numel
from probes.vocabulary.transformer_spec import TransformerSpec

BASE = dict(layers=4, hidden=32, heads=4, seq_len=8, batch_size=8, dropout=0.1)


def spec(world: int = 4, **kw) -> TransformerSpec:
    return TransformerSpec(**{**BASE, "world_size": world, **kw})


def unit_cost(op) -> float:
    return 1e-6 * (1 + op.params.get("bytes", 0) / 1e6) if op.params else 0.0


def named(graph, rank: int, op: str) -> list:
    return [o for o in graph.ranks[rank] if o.op == op]


def test_one_f_one_b_orders_warmup_steady_and_cooldown():
    assert one_f_one_b(1, 0, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    order = one_f_one_b(4, 0, 6)
    assert order[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)] and order[4] == ("B", 0)
    assert one_f_one_b(4, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    for stages, m in ((4, 6), (3, 2), (2, 8)):
        for stage in range(stages):
            order = one_f_one_b(stages, stage, m)
            assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
            in_flight = max(
                sum(1 for k in order[: j + 1] if k[0] == "F") - sum(1 for k in order[: j + 1] if k[0] == "B")
                for j in range(len(order))
            )
            assert in_flight == min(m, stages - stage)


@pytest.mark.parametrize(
    "kw",
    [
        dict(pipeline_parallel=2, micro_batches=4),
        dict(pipeline_parallel=4, micro_batches=8, recompute=True),
        dict(pipeline_parallel=2, tensor_parallel=2, micro_batches=2, vocab_size=64),
        dict(fsdp="full_shard", micro_batches=2),
        dict(fsdp="shard_grad_op"),
        dict(tensor_parallel=2, micro_batches=4, recompute=True),
    ],
)
def test_every_layout_simulates_to_the_end(kw):
    s = spec(**kw)
    result = simulate(build_transformer_graph(s), unit_cost, synchronous=True)
    assert result.iteration_s > 0


def test_pipeline_stages_hold_their_blocks_and_exchange_every_micro_batch():
    s = spec(pipeline_parallel=2, micro_batches=4)  # dp 2: ranks 0,1 stage 0; 2,3 stage 1
    g = build_transformer_graph(s)
    for r in range(4):
        blocks = {o.name.split(".")[1] for o in g.ranks[r] if o.name.startswith("mb0.b")}
        assert blocks == ({"b0", "b1"} if r < 2 else {"b2", "b3"})
        transfers = named(g, r, "broadcast")
        assert len(transfers) == 2 * s.micro_batches  # activations one way, their gradients back
        assert all(o.params["bytes"] == 4 * 2 * 8 * 32 for o in transfers)  # a micro-batch of 2 sequences
        assert sum(o.posted for o in transfers) == s.micro_batches
        # data-parallel gradients: all-reduced once, after the last backward, over the stage's replicas
        reduced = named(g, r, "all_reduce")
        assert sum(o.params["bytes"] for o in reduced) == 4 * stage_param_numel(s, s.stage_of(r))
        assert all(o.group == s.dp_group_of(r) for o in reduced)
        last_backward = max(i for i, o in enumerate(g.ranks[r]) if o.name.startswith("mb3."))
        assert all(g.ranks[r].index(o) > last_backward for o in reduced)


def test_micro_batches_reduce_gradients_once_and_recompute_repeats_the_forward():
    plain = build_transformer_graph(spec(world=2))
    accumulated = build_transformer_graph(spec(world=2, micro_batches=4))
    for g in (plain, accumulated):
        assert sum(o.params["bytes"] for o in named(g, 0, "all_reduce")) == 4 * stage_param_numel(spec(world=2), 0)
    ops = accumulated.ranks[0]
    last_mb2 = max(i for i, o in enumerate(ops) if o.name.startswith("mb2."))
    assert all(ops.index(o) > last_mb2 for o in named(accumulated, 0, "all_reduce"))  # in mb3's backward
    gemms = len(named(plain, 0, "gemm"))
    recomputed = build_transformer_graph(spec(world=2, recompute=True))
    forward_gemms = sum(1 for o in named(plain, 0, "gemm") if "grad" not in o.name)
    assert len(named(recomputed, 0, "gemm")) == gemms + forward_gemms
    assert len(named(accumulated, 0, "gemm")) == 4 * gemms


@pytest.mark.parametrize("mode, gathers_per_block", [("shard_grad_op", 1), ("full_shard", 2)])
def test_fsdp_gathers_parameters_and_reduce_scatters_gradients(mode, gathers_per_block):
    s = spec(world=2, fsdp=mode, micro_batches=2)
    g = build_transformer_graph(s)
    gathered = named(g, 0, "all_gather")
    block_gathers = [o for o in gathered if ".b" in o.name or o.name.startswith("b")]
    assert len(block_gathers) == s.micro_batches * s.layers * gathers_per_block
    assert all(o.params["bytes"] == 4 * block_param_numel(s) for o in block_gathers)
    scattered = named(g, 0, "reduce_scatter")
    assert sum(o.params["bytes"] for o in scattered) == 4 * stage_param_numel(s, 0)
    assert all(o.name.startswith("mb1.") for o in scattered) and not named(g, 0, "all_reduce")


@pytest.mark.parametrize("mode", ["shard_grad_op", "full_shard"])
def test_fsdp_copies_shards_in_and_units_out_around_its_collectives(mode):
    # FSDP2's copies (traced at 6.9 ms of a 113 ms two-rank CPU step, #26): the shard into each
    # gather's input, the gathered unit out into its parameters before the unit runs, and the
    # unit's gradients into each reduce-scatter's input
    s = spec(world=2, fsdp=mode, micro_batches=2)
    ops = build_transformer_graph(s).ranks[0]
    unit = 4 * block_param_numel(s)
    index = {o.name: i for i, o in enumerate(ops)}
    collectives = [i for i, o in enumerate(ops) if o.op in ("all_gather", "reduce_scatter")]
    assert collectives
    for i in collectives:
        o, whole = ops[i], ops[i].params["bytes"]
        copy_in = index[o.name + "_copy_in"]
        assert copy_in in o.deps and ops[copy_in].op == "memcpy"
        assert ops[copy_in].params["bytes"] == (whole // 2 if o.op == "all_gather" else whole)
        if o.op == "all_gather":
            (out,) = [j for j, r in enumerate(ops) if i in r.deps]  # nothing reads the gather but its copy-out
            assert "copy_out" in ops[out].name and ops[out].op == "memcpy" and ops[out].params["bytes"] == whole
            assert whole == unit or "root" in o.name
            assert ops[out + 1].deps and out in ops[out + 1].deps  # the unit's ops follow it
    plain = build_transformer_graph(spec(world=2, micro_batches=2)).ranks[0]
    assert not [o for o in plain if "copy" in o.name]  # DDP's reducer copies are not listed (README, 12-05)


def test_a_pipelines_data_parallel_reduction_copies_its_buckets():
    # the workload's own reduction after a pipeline's last backward: each bucket concatenated,
    # all-reduced, averaged and copied back into the gradients
    s = spec(world=4, pipeline_parallel=2, micro_batches=2)
    ops = build_transformer_graph(s).ranks[0]
    reduces = [i for i, o in enumerate(ops) if o.name.startswith("dp_all_reduce")]
    assert reduces
    for i in reduces:
        size = ops[i].params["bytes"]
        assert ops[i - 1].op == "memcpy" and ops[i - 1].params["bytes"] == size
        assert ops[i + 1].op == "mul" and ops[i + 2].op == "memcpy" and ops[i + 2].params["bytes"] == size


def test_the_step_overheads_features_are_read_from_every_layouts_graph():
    from predictors.features import feature_vector
    from predictors.transformer_estimator import OVERHEAD_FEATURES, overhead_params

    counts = []
    for kw in (dict(), dict(micro_batches=4), dict(micro_batches=4, recompute=True), dict(fsdp="full_shard")):
        s = spec(world=2, **kw)
        params = overhead_params(s, build_transformer_graph(s), 0.01, cost=lambda op: 1e-5)
        vector = feature_vector(OVERHEAD_FEATURES, params)  # every feature the fit reads is there
        assert len(vector) == len(OVERHEAD_FEATURES) and params["layers"] == s.layers
        assert params["gemm_s"] > 0 and params["memory_s"] > 0  # the busiest rank's kernels by class
        counts.append((params["ops"], params["collectives"]))
    plain, accumulated, recomputed, sharded = counts
    assert accumulated[0] > 3 * plain[0] and recomputed[0] > accumulated[0]
    assert sharded[1] > plain[1]  # FSDP's gathers and reduce-scatters


def test_the_collectives_count_splits_into_the_layouts_own_and_ddps_gradient_reduces():
    """The candidate features `layout_collectives` and `gradient_reduces` add up to `collectives`:
    a plain data-parallel step has only DDP's, a TP or FSDP step on two ranks only its own, and a
    TP step with data parallel beside it both."""
    from predictors.transformer_estimator import overhead_params

    def split(world: int, **kw) -> tuple[float, float, float]:
        s = spec(world=world, **kw)
        p = overhead_params(s, build_transformer_graph(s, fold=True), 0.0)
        assert p["layout_collectives"] + p["gradient_reduces"] == p["collectives"]
        return p["collectives"], p["layout_collectives"], p["gradient_reduces"]

    collectives, own, reduces = split(2)
    assert own == 0 and reduces == collectives > 0
    for kw in (dict(tensor_parallel=2), dict(fsdp="full_shard")):
        collectives, own, reduces = split(2, **kw)
        assert reduces == 0 and own == collectives > 0
    _, own, reduces = split(4, tensor_parallel=2)
    assert own > 0 and reduces > 0


def test_the_layouts_collective_seconds_leave_out_ddps_gradient_reduces():
    """The candidate `layout_collective_s` is the busiest rank's collective seconds less DDP's
    gradient all-reduces': none of a plain data-parallel step's, all of a TP step's on two ranks."""
    from predictors.transformer_estimator import overhead_params

    def seconds(world: int, **kw) -> tuple[float, float]:
        s = spec(world=world, **kw)
        p = overhead_params(s, build_transformer_graph(s, fold=True), 0.0, cost=lambda op: 1e-5)
        return p["collective_s"], p["layout_collective_s"]

    total, own = seconds(2)
    assert total > 0 and own == 0
    total, own = seconds(2, tensor_parallel=2)
    assert own == total > 0
    total, own = seconds(4, tensor_parallel=2)
    assert 0 < own < total


@pytest.mark.parametrize("kw", [dict(), dict(tensor_parallel=2), dict(pipeline_parallel=2, micro_batches=2)])
def test_micro_batches_split_the_work_not_repeat_it(kw):
    """Every micro-batch's ops are sized for its share of the batch: the step's GEMM flops and
    element-wise elements are the same whatever the micro-batch count."""

    def work(s):
        g = build_transformer_graph(s)
        flops = sum(o.params["flops"] for r in g.ranks for o in r if o.op == "gemm")
        elements = sum(o.params.get("numel", 0) for r in g.ranks for o in r if o.kind == "compute" and o.op != "gemm")
        return flops, elements

    base = spec(world=4, **kw)
    for micro in (2 * base.micro_batches, 4 * base.micro_batches):
        assert work(spec(world=4, **{**kw, "micro_batches": micro})) == pytest.approx(work(base), rel=1e-6)

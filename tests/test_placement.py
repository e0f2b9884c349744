"""Rank placement: which node every rank runs on decides each collective's curve (one node or
across nodes), in the graphs, the costs and the plan; an uncalibrated scope is a named error."""

import numpy as np
import pytest
from synthetic_rows import gemm_rows

from orchestrator.cli.options import EXIT_BAD_INPUT, run_main
from orchestrator.cluster import GIB, DeviceInfo, HardwareFingerprint, NodeFingerprint
from policies.planning import job_placement, make_plan
from predictors import fit_performance_model
from predictors.collective_curves import UncalibratedGroupError
from predictors.dlrm_estimator import estimate_iteration
from predictors.dlrm_graph import build_dlrm_graph
from predictors.transformer_graph import build_transformer_graph
from probes.vocabulary.jobspec import JobSpec, JobSpecError, TableShape
from probes.vocabulary.ops import collective_params, elementwise_params, memcpy_params
from probes.vocabulary.placement import PlacementError, RankPlacement
from probes.vocabulary.records import Measurement
from probes.vocabulary.tbe_features import expected_features
from probes.vocabulary.transformer_spec import TransformerSpec


def test_packed_placement_fills_nodes_in_order():
    p = RankPlacement.packed(16, [8, 8])
    assert p.nodes == (0,) * 8 + (1,) * 8
    assert p.scope() == "inter" and p.scope(range(8)) == "intra" and p.scope([7, 8]) == "inter"
    assert RankPlacement.packed(6, [8, 8]).scope() == "intra"
    assert RankPlacement.packed(3, [2, 1]).ranks_per_node() == {0: 2, 1: 1}
    with pytest.raises(
        PlacementError, match=r"world_size: 20 ranks do not fit the cluster's 16 device\(s\).*allowed: 1..16"
    ):
        RankPlacement.packed(20, [8, 8])


def test_placement_round_trips_and_old_records_mean_one_node():
    p = RankPlacement.from_node_names(["b", "b", "a"])
    assert p.nodes == (0, 0, 1)
    assert RankPlacement.from_dict(p.to_dict(), 3) == p
    assert RankPlacement.from_dict(None, 4) == RankPlacement.single_node(4)
    with pytest.raises(PlacementError, match="world_size=4"):
        RankPlacement.from_dict(p.to_dict(), 4)


def job(world: int, tables: int = 8) -> JobSpec:
    return JobSpec.from_dict(
        {
            "name": "wide",
            "workload": "dlrm",
            "world_size": world,
            "batch_size": 64,
            "dense": {"num_dense_features": 4, "bottom_mlp": [32], "top_mlp": [16, 1]},
            "tables": [
                {"name": f"t{i}", "num_embeddings": 2000 * (i + 1), "embedding_dim": 16, "pooling_factor": 1 + i % 4}
                for i in range(tables)
            ],
        }
    )


def bundle(curves: dict[str, float]):
    """A fitted bundle: synthetic GEMM and lookup rows, and all-to-all / all-reduce curves for
    each group `"world:scope"` at the given bandwidth (bytes/s)."""
    rng = np.random.default_rng(0)
    rows = gemm_rows(rng, 40)
    for i in range(30):
        tables = [
            TableShape(int(rng.integers(1000, 50_000)), 16, int(rng.integers(1, 8)))
            for _ in range(int(rng.integers(1, 5)))
        ]
        p = expected_features(tables, int(rng.integers(64, 2048)), seed=i)
        for op in ("embedding_fwd", "embedding_bwd"):
            rows.append(Measurement(op, p, 1e-5 + p["gathered_elems"] / 1e9, 0, 5))
    for i in range(20):  # element-wise ops and copies at 10 GB/s
        rows_, cols = int(rng.integers(16, 4096)), int(rng.integers(16, 1024))
        for op in ("relu", "mul", "add"):
            p = elementwise_params(op, rows_, cols)
            rows.append(Measurement(op, p, 2e-6 + p["bytes"] / 1e10, 0, 5))
        p = memcpy_params("d2d", rows_ * cols * 4)
        rows.append(Measurement("memcpy", p, 2e-6 + p["bytes"] / 1e10, 0, 5))
    for key, bandwidth in curves.items():
        world, scope = key.split(":")
        for op in ("all_reduce", "all_to_all"):
            for e in range(4, 27, 2):  # 16 B to 64 MiB: a straight line needs no more sizes
                rows.append(
                    Measurement(op, collective_params(op, 2**e, int(world), scope), 30e-6 + 2**e / bandwidth, 0, 11)
                )
    # two judge folds, not five: the models fitted on every row are the same (the folds only
    # score them), and these tests price with the models, never read the scores
    model, _ = fit_performance_model(rows, "synthetic", folds=2)
    return model


def gpu_cluster(nodes: int, per_node: int, head: bool = True) -> HardwareFingerprint:
    """A declared cluster: `nodes` x `per_node` 80 GiB GPUs, and a CPU head offering no device."""

    def node(i: int, gpus: int) -> NodeFingerprint:
        devices = [DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 80 * GIB, d) for d in range(gpus)]
        return NodeFingerprint(f"host{i}", "Xeon", 64, 512 * GIB, devices, node_id=f"node{i}")

    head_node = NodeFingerprint(
        "head", "Xeon", 8, 32 * GIB, [DeviceInfo("cpu", "Xeon", 4 * GIB, i) for i in range(8)], node_id="head"
    )
    return HardwareFingerprint(([head_node] if head else []) + [node(i, per_node) for i in range(nodes)])


def test_graphs_take_each_group_scope_from_the_placement():
    placement = RankPlacement.packed(16, [8, 8])
    graph = build_dlrm_graph(job(16), [i % 16 for i in range(8)], placement)
    scopes = {(o.params["world"], o.params["scope"]) for r in graph.ranks for o in r if o.kind == "collective"}
    assert scopes == {(16, "inter")}
    assert graph.meta["placement"]["ranks_per_node"] == {"0": 8, "1": 8}
    # TP inside a node, DP across nodes: each group's collectives on its own scope's curve
    spec = TransformerSpec(layers=1, hidden=64, heads=8, seq_len=8, batch_size=2, world_size=16, tensor_parallel=8)
    tf = build_transformer_graph(spec, placement)
    by_group = {(o.params["world"], o.params["scope"]) for r in tf.ranks for o in r if o.kind == "collective"}
    assert by_group == {(8, "intra"), (2, "inter")}


def test_a_16_rank_job_on_two_8_device_nodes_is_priced_on_curves_spanning_nodes():
    model = bundle({"8:intra": 100e9, "16:inter": 10e9})
    fp = gpu_cluster(2, 8)
    assert fp.devices_per_node == [8, 8], "the CPU head is not a device node"
    spec = job(16)
    plan = make_plan(spec, model, fp, "1")
    assert plan.placement["scope"] == "inter"
    assert plan.placement["ranks_per_node"] == {"0": 8, "1": 8}
    assert plan.placement["node_ids"] == ["node0", "node1"]
    assert plan.placement["node_types"] == [fp.device_nodes[0].label()]
    chosen = plan.decisions["sharding"]
    cost = estimate_iteration(spec, plan.table_to_rank, model, placement=plan.rank_placement)
    assert chosen.predicted_ms == pytest.approx(cost.iteration_s * 1e3)
    # the all-to-all in the breakdown is the inter-node curve's, forward and backward
    from predictors.dlrm_graph import all_to_all_params

    inter = model.predict("all_to_all", **all_to_all_params(spec, plan.table_to_rank, "inter"))
    assert cost.all_to_all_s == pytest.approx(2 * inter)
    # the same job within one node would be priced on the faster intra-node curve
    eight = job(8)
    one_node = estimate_iteration(
        eight, [i % 8 for i in range(8)], bundle({"8:intra": 100e9, "8:inter": 1e9}), placement=job_placement(eight, fp)
    )
    assert one_node.all_to_all_s < 2 * inter


def test_a_bundle_with_only_intra_node_curves_says_what_to_calibrate():
    model = bundle({"8:intra": 100e9, "16:intra": 100e9})
    with pytest.raises(UncalibratedGroupError) as err:
        make_plan(job(16), model, gpu_cluster(2, 8), "1")
    message = str(err.value)
    assert "16:inter (16 ranks spanning nodes)" in message
    assert "measured groups: 16:intra, 8:intra" in message
    assert "python -m orchestrator.cli.calibrate" in message

    def plan_cli(argv):
        make_plan(job(16), model, gpu_cluster(2, 8), "1")

    assert run_main(plan_cli, []) == EXIT_BAD_INPUT


def test_a_job_larger_than_the_cluster_names_world_size():
    with pytest.raises(JobSpecError, match=r"world_size: 24 ranks do not fit the cluster's 16 device"):
        job_placement(job(24), gpu_cluster(2, 8))

"""The whole autotune cycle against a simulated multi-node Ray cluster, by address, as on KubeRay:
a head that offers no devices, and two worker nodes of different sizes (2 and 1 CPU slots)."""

import json
import os
from pathlib import Path

import pytest
import yaml
from test_e2e import cli, last_json


@pytest.fixture()
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # this process does not join; the CLIs under test do
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        big, small = c.add_node(num_cpus=2), c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c, c.head_node.node_id, big.node_id, small.node_id
    finally:
        c.shutdown()


@pytest.mark.slow
def test_autotune_cycle_on_a_cluster_whose_head_offers_no_devices(tmp_path, tiny_job_dict, cluster):
    c, head, big, small = cluster
    job = {**tiny_job_dict, "world_size": 3, "name": "spread"}  # 2 ranks on the big node, 1 on the small one
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out = last_json(
        cli(
            "orchestrator.autotune",
            "--job",
            "job.yaml",
            "--ray-address",
            c.address,
            "--calibration-budget-s",
            "40",
            "--json",
            cwd=tmp_path,
        ).stdout
    )

    # the head is no device: 3 devices on 2 device nodes of two types
    hw = out["hardware_id"]
    assert hw.startswith("mixed-n2-"), hw
    assert out["recalibrated"] and out["calibration"]["promoted"]

    # ranks packed onto the worker nodes, biggest first; they ran where the prediction put them
    placement = out["placement"]
    assert placement["planned"]["ranks_per_node"] == {"0": 2, "1": 1}
    assert placement["planned"]["node_ids"] == [big, small]
    assert placement["rank_nodes"] == [big, big, small] and placement["as_planned"] is True
    assert head not in placement["rank_nodes"]
    # the simulated nodes share this host: its 3 ranks split its cores as one host's (`core_binding`)
    assert len(placement["rank_cores"]) == 3
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2:
        assert placement["rank_cores"][0] != placement["rank_cores"][1]

    # calibration measured groups on one node and across nodes, and training at both worlds
    import mlflow
    from mlflow import MlflowClient

    from orchestrator import registry
    from policies.plan import Plan
    from predictors.collective_curves import UncalibratedGroupError
    from predictors.dlrm_estimator import estimate_iteration
    from probes.vocabulary.jobspec import JobSpec
    from probes.vocabulary.placement import RankPlacement

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/.autotune/mlflow.db")
    champion = registry.get_alias(hw, registry.CHAMPION)
    curves = set(champion.model.models["all_to_all"].curves)
    assert {"2:intra", "2:inter", "3:inter"} <= curves, curves
    stored = Path(tmp_path) / out["calibration"]["measurements"]
    rows = [json.loads(line) for line in stored.read_text().splitlines()]
    steps = [json.loads(r["params"]) for r in rows if r["op"] == "dlrm_step"]
    assert {tuple(s["placement"]["nodes"]) for s in steps} <= {(0, 0, 1), (0, 0)}

    # the plan's collectives are priced on the curves of 3 ranks spanning nodes
    plan = Plan.load(Path(tmp_path) / out["plan"])
    spec = JobSpec.from_dict(job)
    assert plan.placement["scope"] == "inter" and set(plan.placement["node_types"]) == {"cpu2c", "cpu1c"}
    cost = estimate_iteration(spec, plan.table_to_rank, champion.model, placement=plan.rank_placement)
    assert plan.decisions["sharding"].predicted_ms == pytest.approx(cost.iteration_s * 1e3)
    with pytest.raises(UncalibratedGroupError, match="3:intra"):  # no node holds 3 ranks: never measured
        estimate_iteration(spec, plan.table_to_rank, champion.model, placement=RankPlacement.single_node(3))

    # prediction, measurement and placement are logged
    client = MlflowClient()
    run = client.get_run(out["run_id"])
    assert {"predicted_iteration_ms", "measured_iteration_ms", "prediction_error"} <= set(run.data.metrics)
    assert run.data.tags["placement_scope"] == "inter" and run.data.tags["placement_as_planned"] == "True"
    logged = mlflow.artifacts.load_dict(f"runs:/{out['run_id']}/placement.json")
    assert logged["rank_nodes"] == [big, big, small]

    # the stored multi-node calibration refits from this (single-node) machine, under its own hardware
    refit = last_json(cli("orchestrator.cli.calibrate", "--refit", str(stored.parent), "--json", cwd=tmp_path).stdout)
    assert refit["hardware_id"] == hw and refit["model"].endswith("/2")

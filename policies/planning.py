"""Plan assembly: every decision for a job on a hardware with its registered models (no launch).

The hardware is whatever describes the cluster's device nodes (`orchestrator.cluster`'s
`Hardware` in the product); only the few facts below are read, so the modelling
core plans without Ray.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from policies.chunking import choose_chunking
from policies.parallelism import choose_parallelism
from policies.plan import Decision, Plan
from policies.sharding import choose_sharding
from policies.substitution import choose_substitutions
from predictors.ddp_buckets import ddp_buckets
from predictors.dlrm_estimator import estimate_iteration
from predictors.dlrm_graph import FLOAT, build_dlrm_graph, dense_parameter_bytes, dlrm_slice_params
from predictors.network import (
    NetworkError,
    NetworkTopology,
    check_topology_size,
    dimension_from_model,
    topology_from_config,
)
from predictors.overlap_model import scale_gemm_rows
from predictors.performance_model import PerformanceModel
from predictors.simulator import model_cost
from predictors.transformer_graph import build_transformer_graph, stage_param_numel
from probes.vocabulary.jobspec import JobSpec, JobSpecError
from probes.vocabulary.placement import PlacementError, RankPlacement
from probes.vocabulary.transformer_job import TransformerJob
from probes.vocabulary.transformer_spec import TransformerSpec


class DeviceNode(Protocol):
    @property
    def node_id(self) -> str: ...

    def label(self) -> str: ...


class Hardware(Protocol):
    """What planning reads of a cluster: its id, its device nodes (most devices first) and the
    smallest device's memory (0 when unknown)."""

    @property
    def hardware_id(self) -> str: ...

    @property
    def devices_per_node(self) -> list[int]: ...

    @property
    def device_nodes(self) -> Sequence[DeviceNode]: ...

    @property
    def min_device_memory_bytes(self) -> int: ...


# Embedding weights may use this share of a device's memory when the job sets no cap: the
# rest holds activations, communication buffers and the framework.
DEFAULT_MEMORY_SHARE = 0.6
# A transformer's predicted peak per rank may use this share of the smallest device's memory
# when the job sets no cap (the rest: the framework, allocator fragmentation, NCCL buffers).
TRANSFORMER_MEMORY_SHARE = 0.9


def memory_cap_bytes(
    job: JobSpec | TransformerJob, fingerprint: Hardware, share: float = DEFAULT_MEMORY_SHARE
) -> float:
    """The job's cap, else `share` of the smallest device's memory (the device nodes', never
    the driver's or a device-less head's)."""
    if job.memory_cap_gb is not None:
        return job.memory_cap_gb * 2**30
    if fingerprint.min_device_memory_bytes <= 0:
        raise JobSpecError(
            [
                "memory_cap_gb: required here: the devices' memory is unknown (GPUs that Ray declares "
                "but NVML does not see); expected a number of GiB > 0"
            ]
        )
    return share * fingerprint.min_device_memory_bytes


def job_placement(job: JobSpec | TransformerJob, fingerprint: Hardware) -> RankPlacement:
    """The job's ranks packed onto the device nodes, most devices first (as the launcher
    places them); a job larger than the cluster is refused, naming `world_size`."""
    try:
        return RankPlacement.packed(job.world_size, fingerprint.devices_per_node)
    except PlacementError as exc:
        raise JobSpecError([str(exc)]) from None


def placement_record(placement: RankPlacement, fingerprint: Hardware) -> dict:
    """What the plan says of where it runs: each rank's node, the Ray node ids to pin them to,
    and the node types priced (the hardware classes of the nodes the ranks occupy)."""
    device_nodes = fingerprint.device_nodes
    used = sorted(set(placement.nodes))
    return {
        **placement.to_dict(),
        "node_ids": [n.node_id for n in device_nodes[: max(used) + 1]],
        "node_types": sorted({device_nodes[i].label() for i in used}),
        "scope": placement.scope(),
    }


def require_collectives(model: PerformanceModel, job: JobSpec, placement: RankPlacement) -> None:
    """Fail early, saying what to calibrate, when the bundle has no curve for the job's group
    (its size, within a node or across nodes): every candidate plan would need it."""
    if job.world_size < 2:
        return
    for op in ("all_to_all", "all_reduce"):
        if op in model.models:
            model.predict(op, bytes=4096, world=job.world_size, scope=placement.scope())


def job_topology(job: JobSpec | TransformerJob, model: PerformanceModel, fingerprint: Hardware) -> NetworkTopology:
    """The network the job's `network` section names: a preset, explicit dims, or `calibrated`:
    this cluster's devices per node over its nodes, each dimension fitted from the measured
    reduce-scatter of a group that size (intra-node, then inter-node)."""
    assert job.network is not None
    if job.network.get("topology") == "calibrated":
        per_node, nodes = max(fingerprint.devices_per_node), len(fingerprint.device_nodes)
        dims = []
        try:
            if per_node > 1:
                dims.append(dimension_from_model(model, per_node, "intra", name="intra-node"))
            if nodes > 1:
                dims.append(dimension_from_model(model, nodes, "inter", name="inter-node"))
        except KeyError as exc:
            raise NetworkError(f"network.topology: calibrated needs measured reduce_scatter curves: {exc}") from None
        if not dims:
            raise NetworkError("network.topology: calibrated needs more than one device")
        topology = NetworkTopology(name=f"calibrated-{fingerprint.hardware_id}", dims=tuple(dims))
    else:
        topology = topology_from_config(job.network)
    return check_topology_size(topology, job.world_size)


def gradient_all_reduce_bytes(job: JobSpec | TransformerJob, parameter_bytes: int | None = None) -> float:
    """The largest DDP bucket the replicated parameters' gradients fill (as the iteration graph
    buckets them; `parameter_bytes` default: a DLRM's dense layers), or the job's
    `network.collective_mb`."""
    if job.network and job.network.get("collective_mb"):
        return float(job.network["collective_mb"]) * 2**20
    if parameter_bytes is None:
        assert isinstance(job, JobSpec)
        parameter_bytes = dense_parameter_bytes(job)
    return float(max(ddp_buckets(parameter_bytes)))


def chunking_decision(job: JobSpec, model: PerformanceModel, fingerprint: Hardware) -> Decision:
    return choose_chunking(job_topology(job, model, fingerprint), gradient_all_reduce_bytes(job))


def make_plan(job: JobSpec, model: PerformanceModel, fingerprint: Hardware, model_version: str | None) -> Plan:
    placement = job_placement(job, fingerprint)
    require_collectives(model, job, placement)
    sharding = choose_sharding(
        job,
        model,
        memory_cap_bytes(job, fingerprint),
        seed=job.seed,
        device_memory_bytes=fingerprint.min_device_memory_bytes or None,
        placement=placement,
    )
    notes = [
        "iteration cost = critical-path simulation of the job's execution graph (per-op models, in-step "
        "corrections, waits at every collective) + the fitted per-step overhead",
        f"ranks packed onto {placement.node_count} node(s) ({', '.join(map(str, placement.ranks_per_node().values()))} "
        f"rank(s) each): the job's collectives priced on the {placement.scope()}-node curves of {job.world_size} ranks",
    ]
    best = sharding.candidates[0]
    out_of_range = best.detail.get("breakdown", {}).get("out_of_range", [])
    if out_of_range:
        notes.append("extrapolating beyond measurements: " + "; ".join(out_of_range[:5]))
    decisions = {"sharding": sharding}
    table_to_rank = sharding.choice_detail["table_to_rank"]
    substitution = choose_substitutions(
        build_dlrm_graph(job, table_to_rank, placement),
        model,
        dlrm_slice_params(job, table_to_rank),
        cost=model_cost(model, workload="dlrm"),  # priced as the sharding estimate prices it
    )
    decisions["substitution"] = substitution
    predicted_ms = sharding.predicted_ms
    notes.append(
        "substitution: each compute+collective pair of the chosen plan's graph simulated unfused and as a "
        "k-slice overlapped pipeline (predictors/overlap_model.py); its predicted time is the kernels' "
        "critical path without the step overhead"
    )
    if substitution.choice_detail["substitutions"]:  # the job runs them, so the prediction includes their gain
        predicted_ms -= substitution.choice_detail["unfused_ms"] - substitution.predicted_ms
        notes.append(
            f"predicted iteration time includes the substituted pairs ({substitution.choice}): "
            f"{sharding.predicted_ms:.2f} ms unfused"
        )
    if job.network is not None:
        decisions["chunking"] = chunking_decision(job, model, fingerprint)
        notes.append(
            "chunking: the gradient all-reduce of one DDP bucket, simulated chunk by chunk on the "
            "job's network (predictors/chunk_sim.py); not part of the iteration time above"
        )
    return Plan(
        job=job.to_dict(),
        hardware_id=fingerprint.hardware_id,
        model_version=model_version,
        predicted_iteration_ms=predicted_ms,
        decisions=decisions,
        notes=notes,
        placement=placement_record(placement, fingerprint),
    )


def make_transformer_plan(
    job: TransformerJob, model: PerformanceModel, fingerprint: Hardware, model_version: str | None
) -> Plan:
    """The layout (policies/parallelism.py), then for it: which row-parallel GEMM + all-reduce
    pairs to overlap (tensor-parallel layouts) and how to chunk the gradient all-reduce over
    the job's `network` (DDP over the whole world)."""
    placement = job_placement(job, fingerprint)
    cap = memory_cap_bytes(job, fingerprint, TRANSFORMER_MEMORY_SHARE)
    parallelism = choose_parallelism(job, model, cap, placement)
    spec = TransformerSpec.from_dict(parallelism.choice_detail["layout"])
    decisions = {"parallelism": parallelism}
    notes = [
        "iteration cost = critical-path simulation of the layout's execution graph (1F1B pipeline schedule, "
        "TP collectives on the critical path, DP buckets overlapped and sharing the link) + the fitted "
        "per-step overhead",
        f"memory cap {cap / 2**30:.2f} GiB per rank (predicted peak; layouts over it refused)",
        f"{parallelism.choice_detail['priced']} layout(s) priced of {len(parallelism.candidates)}",
    ]
    if "transformer" not in model.step_overheads:
        notes.append(
            "no transformer step overhead in this bundle (its calibration measured no transformer steps): "
            "every layout's time is its simulated kernels only, a lower bound"
        )
    predicted_ms = parallelism.predicted_ms
    graph = build_transformer_graph(spec, placement, fold=True)
    if graph.meta.get("substitutable"):
        substitution = choose_substitutions(
            graph,
            model,
            lambda _r, op, k: scale_gemm_rows(op.params, k),
            cost=model_cost(model, workload="transformer"),
        )
        decisions["substitution"] = substitution
        if substitution.choice_detail["substitutions"]:
            predicted_ms -= substitution.choice_detail["unfused_ms"] - substitution.predicted_ms
            notes.append(f"predicted iteration time includes the overlapped pairs ({substitution.choice})")
    if job.network is not None:
        if spec.data_parallel == job.world_size and spec.fsdp == "none":
            largest = gradient_all_reduce_bytes(job, FLOAT * stage_param_numel(spec, 0))
            decisions["chunking"] = choose_chunking(job_topology(job, model, fingerprint), largest)
            notes.append("chunking: the largest DDP gradient bucket, simulated chunk by chunk on the job's network")
        else:
            notes.append(
                f"chunking: not applied: the chosen layout ({spec.layout}) does not all-reduce its gradients with "
                "DDP over the whole world the network describes"
            )
    return Plan(
        job=job.to_dict(),
        hardware_id=fingerprint.hardware_id,
        model_version=model_version,
        predicted_iteration_ms=predicted_ms,
        decisions=decisions,
        notes=notes,
        placement=placement_record(placement, fingerprint),
    )


def predict_plan_ms(job: JobSpec, plan: Plan, model: PerformanceModel) -> float:
    return estimate_iteration(job, plan.table_to_rank, model, placement=plan.rank_placement).iteration_s * 1e3

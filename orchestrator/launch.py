"""Launching the real job with a plan: Ray Train's TorchTrainer over the same Ray cluster.

Each worker builds its rank of the sharded DLRM (probes.workloads.dlrm), or of the parallel
transformer block stack (probes.workloads.transformer), on the process group Ray Train set up
(NCCL with GPUs, gloo without) and times `iterations` steps after warm-up. The reported
iteration time is the median over steps of the slowest rank's step time.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from orchestrator.home import home_path
from probes.vocabulary.chunks import ChunkSchedule, ScheduleError
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.placement import PlacementError
from probes.vocabulary.table_shards import PlanEntry, table_shards


@dataclass
class LaunchResult:
    iteration_ms: float
    iterations: int
    per_iteration_ms: list[float]
    loss_first: float
    loss_last: float
    quiet_wait_s: float | None = None  # how long the host took to go quiet before timing
    host_quiet: bool | None = None  # False: timed although the host never went quiet
    # share of rank 0's host's cores busy outside the job's ranks there while the steps were timed
    host_other_share: float | None = None
    rank_nodes: list[str] | None = None  # the Ray node id each rank ran on
    placement_as_planned: bool | None = None  # every rank on the node the prediction assumed (None: none asked)
    rank_cores: list[list[int] | None] | None = None  # the cores each rank was bound to (None: unbound)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _train_loop(config: dict[str, Any]) -> dict[str, Any] | None:
    """One rank of the launched job; rank 0 returns its timings (Ray Train hands the value to
    the driver as `Result.return_value`)."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from orchestrator.core_binding import bind_slot, host_slots
    from orchestrator.quiet_host import cpu_mark, other_share, wait_for_quiet_host

    torch.set_num_threads(config["threads_per_worker"])
    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL collectives and batched point-to-point use the current device
    # Where every rank runs, as run (the launcher compares its node with the placement it asked
    # for; its host decides its share of the cores).
    where: list = [None] * ctx.get_world_size()
    dist.all_gather_object(where, (ray.get_runtime_context().get_node_id(), socket.gethostname()))
    rank_nodes = [node for node, _ in where]
    # Each rank on its own share of its host's cores, as the calibration's probe actors ran
    # (`core_binding`): bound after the process group is up, so its threads are bound too.
    cores = bind_slot(host_slots([host for _, host in where])[ctx.get_world_rank()], config["core_binding"])
    rank_cores: list = [None] * ctx.get_world_size()
    dist.all_gather_object(rank_cores, cores)
    # Rank 0 waits out Ray Train's start-up on the host; the others sleep in the barrier.
    quiet = wait_for_quiet_host() if ctx.get_world_rank() == 0 else None
    dist.barrier()
    if "plans" in config:
        from probes.workloads.plan_race import race_plans

        start = cpu_mark()  # the race builds each plan's model inside its timed span
        race = race_plans(
            JobSpec.from_dict(config["job"]),
            config["plans"],
            ctx.get_world_rank(),
            ctx.get_world_size(),
            device,
            config["rounds"],
            config["steps_per_round"],
            config["warmup"],
        )
        end = cpu_mark()
        metrics = {
            "plans": [
                {**_metrics(r), "iteration_ms": float(t) * 1e3, "raw_median_ms": r.median_s * 1e3}
                for r, t in zip(race.steps, race.plan_seconds())
            ],
            "round_medians_ms": (race.round_medians_s * 1e3).tolist(),
        }
        summary = {f"plan{k}_iteration_ms": m["iteration_ms"] for k, m in enumerate(metrics["plans"])}
    else:
        if "transformer" in config:
            from probes.vocabulary.transformer_spec import TransformerSpec
            from probes.workloads.hierarchical_allreduce import chunked_comm_hook
            from probes.workloads.transformer import ParallelTransformer

            model = ParallelTransformer(
                TransformerSpec.from_dict(config["transformer"]),
                ctx.get_world_rank(),
                device,
                comm_hook=chunked_comm_hook(config["chunk_schedule"]) if config.get("chunk_schedule") else None,
                overlap_slices=config.get("overlap_slices"),
            )
        else:
            from probes.workloads.dlrm import ShardedDLRM

            spec = JobSpec.from_dict(config["job"])
            model = ShardedDLRM(
                spec,
                config["table_to_rank"],
                ctx.get_world_rank(),
                ctx.get_world_size(),
                device,
                chunk_schedule=config.get("chunk_schedule"),
                overlap_slices=config.get("overlap_slices", {}).get("embedding_all_to_all", 1),
            )
        start = cpu_mark()
        result = model.run(config["iterations"], config["warmup"])
        end = cpu_mark()
        metrics = summary = _metrics(result)
    # Each rank's own CPU over its timed span, so rank 0 can tell its host's other load from the job's.
    own_s: list = [None] * ctx.get_world_size()
    dist.all_gather_object(own_s, end.own_s - start.own_s)
    if quiet is not None:
        here = rank_nodes[ctx.get_world_rank()]
        metrics.update(
            quiet_wait_s=quiet.waited_s,
            host_busy_share=quiet.busy_share,
            host_quiet=quiet.quiet,
            rank_nodes=rank_nodes,
            rank_cores=rank_cores,
            host_other_share=other_share(
                start, end, [s for s, node in zip(own_s, rank_nodes) if node == here], os.cpu_count() or 1
            ),
        )
    ray.train.report(summary)
    return metrics if ctx.get_world_rank() == 0 else None


def _metrics(result: Any) -> dict[str, Any]:
    return {
        "iteration_ms": result.median_s * 1e3,
        "per_iteration_ms": [t * 1e3 for t in result.iteration_s],
        "loss_first": result.losses[0],
        "loss_last": result.losses[-1],
    }


def launch_dlrm(
    spec: JobSpec,
    table_to_rank: Sequence[PlanEntry],
    iterations: int | None = None,
    use_gpu: bool = False,
    storage: str | Path | None = None,
    chunk_schedule: dict | None = None,
    substitutions: dict[str, int] | None = None,
    placement: dict[str, Any] | None = None,
) -> LaunchResult:
    """Run the job for real with a sharding plan: per table a rank (table-wise) or a row-/
    column-wise / data-parallel entry (`probes.vocabulary.table_shards`); with a chunk schedule (the plan's
    chunking decision), the dense gradients are all-reduced by it (a DDP communication hook);
    `substitutions` (the plan's substitution decision, pair -> slices) runs those pairs overlapped;
    `placement` (the plan's: each rank's node index and the Ray node ids) pins every rank to
    the node the prediction assumed."""
    substitutions = _checked_substitutions(substitutions, {"embedding_all_to_all"})
    table_shards(spec, table_to_rank)  # a bad plan fails here, naming the entry, before any worker starts
    if chunk_schedule is not None and ChunkSchedule.from_dict(chunk_schedule).world_size != spec.world_size:
        raise ScheduleError(f"chunk schedule grid {chunk_schedule['dims']} does not hold world_size={spec.world_size}")
    config = {
        "job": spec.to_dict(),
        "table_to_rank": list(table_to_rank),
        "chunk_schedule": chunk_schedule,
        "overlap_slices": substitutions,
        "iterations": iterations or spec.iterations,
        "warmup": spec.warmup_iterations,
    }
    return _launch(config, spec.world_size, f"dlrm-{spec.name}", use_gpu, storage, placement)


def race_dlrm_plans(
    spec: JobSpec,
    plans: Sequence[Sequence[PlanEntry]],
    rounds: int = 10,
    steps_per_round: int = 8,
    use_gpu: bool = False,
    storage: str | Path | None = None,
    placement: dict[str, Any] | None = None,
) -> list[LaunchResult]:
    """Run several plans of one job for real in one Ray Train run, their timed steps interleaved
    in rounds (`probes.workloads.plan_race`), so the comparison does not ride on the host's
    drift; one result per plan, in order, whose `iteration_ms` is the drift-adjusted time
    (`per_iteration_ms` keeps every raw step)."""
    for plan in plans:
        table_shards(spec, plan)
    config = {
        "job": spec.to_dict(),
        "plans": [list(p) for p in plans],
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "warmup": spec.warmup_iterations,
    }
    metrics = _run(config, spec.world_size, f"dlrm-race-{spec.name}", use_gpu, storage, placement)
    host = {
        k: metrics[k]
        for k in ("quiet_wait_s", "host_quiet", "host_other_share", "rank_nodes", "rank_cores")
        if k in metrics
    }
    return [_result({**m, **host}, rounds * steps_per_round, placement) for m in metrics["plans"]]


def launch_transformer(
    spec: Any,
    iterations: int | None = None,
    use_gpu: bool = False,
    storage: str | Path | None = None,
    substitutions: dict[str, int] | None = None,
    placement: dict[str, Any] | None = None,
    chunk_schedule: dict | None = None,
) -> LaunchResult:
    """Run a `TransformerSpec` (any layout) for real and time it; `substitutions`
    ("b{layer}.out" / "b{layer}.fc2" -> slices) runs those row-parallel pairs overlapped; a
    chunk schedule all-reduces DDP's gradient buckets by it (DDP over the whole world)."""
    allowed = {f"b{layer}.{name}" for layer in range(spec.layers) for name in ("out", "fc2")}
    if chunk_schedule is not None and ChunkSchedule.from_dict(chunk_schedule).world_size != spec.data_parallel:
        raise ScheduleError(
            f"chunk schedule grid {chunk_schedule['dims']} does not hold the {spec.data_parallel} data-parallel ranks"
        )
    config = {
        "transformer": spec.to_dict(),
        "overlap_slices": _checked_substitutions(substitutions, allowed, allowed),
        "chunk_schedule": chunk_schedule,
        "iterations": iterations or spec.iterations,
        "warmup": spec.warmup_iterations,
    }
    return _launch(config, spec.world_size, f"transformer-{spec.name}", use_gpu, storage, placement)


def _checked_substitutions(
    substitutions: dict[str, int] | None, allowed: set[str], fused_kernel: set[str] = frozenset()
) -> dict[str, int]:
    """A substitution decision the job can run, refused before any worker starts otherwise.
    Slices 0 (`policies.substitution.SYMM_MEM_SLICES`) runs PyTorch's symmetric-memory fused
    kernels, for the pairs in `fused_kernel` (the row-parallel GEMM + all-reduce pairs)."""
    out = {}
    for name, slices in (substitutions or {}).items():
        if name not in allowed:
            raise ValueError(f"substitutions: no pair {name!r} in this job; allowed: {sorted(allowed)}")
        lowest = 0 if name in fused_kernel else 1
        if int(slices) < lowest:
            raise ValueError(
                f"substitutions[{name!r}]: slices must be >= {lowest}"
                f"{' (0: the symmetric-memory fused kernels)' if lowest == 0 else ''}, got {slices}"
            )
        out[name] = int(slices)
    return out


def _launch(
    config: dict[str, Any],
    world_size: int,
    name: str,
    use_gpu: bool,
    storage: str | Path | None,
    placement: dict[str, Any] | None,
) -> LaunchResult:
    return _result(_run(config, world_size, name, use_gpu, storage, placement), config["iterations"], placement)


def _result(metrics: dict[str, Any], iterations: int, placement: dict[str, Any] | None) -> LaunchResult:
    rank_nodes = metrics.get("rank_nodes")
    planned = planned_rank_nodes(placement)
    return LaunchResult(
        float(metrics["iteration_ms"]),
        iterations,
        list(metrics["per_iteration_ms"]),
        float(metrics["loss_first"]),
        float(metrics["loss_last"]),
        metrics.get("quiet_wait_s"),
        metrics.get("host_quiet"),
        metrics.get("host_other_share"),
        rank_nodes,
        None if planned is None or rank_nodes is None else list(rank_nodes) == planned,
        rank_cores=metrics.get("rank_cores"),
    )


# Every Ray node carries its id under this label (ray.util.placement_group.NODE_ID_LABEL_KEY).
NODE_ID_LABEL = "ray.io/node-id"


def planned_rank_nodes(placement: dict[str, Any] | None) -> list[str] | None:
    """The Ray node id each rank should run on, from a plan's placement (None: no node ids)."""
    if not placement or not placement.get("node_ids"):
        return None
    ids, nodes = placement["node_ids"], placement["nodes"]
    if max(nodes) >= len(ids):
        raise PlacementError(f"placement.nodes: rank on node {max(nodes)}, but only {len(ids)} node id(s) given")
    return [ids[n] for n in nodes]


def worker_label_selectors(placement: dict[str, Any] | None, world_size: int) -> list[dict[str, str]] | None:
    """One label selector per Ray Train worker, pinning it to its rank's node. Ray Train numbers
    ranks node by node in worker order, and a packed placement lists each node's ranks
    together, so rank r runs where the prediction put it."""
    planned = planned_rank_nodes(placement)
    if planned is None:
        return None
    if len(planned) != world_size:
        raise PlacementError(f"placement.nodes: {len(planned)} ranks placed, the job has world_size={world_size}")
    return [{NODE_ID_LABEL: node} for node in planned]


def _run(
    config: dict[str, Any],
    world_size: int,
    name: str,
    use_gpu: bool,
    storage: str | Path | None,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from orchestrator.core_binding import binding_mode

    binding = binding_mode()  # read (and refused) here, not on the workers, whose env may differ
    available = ray.cluster_resources().get("GPU" if use_gpu else "CPU", 0)
    if available < world_size:
        raise RuntimeError(
            f"job needs world_size={world_size} {'GPU' if use_gpu else 'CPU'} workers, "
            f"the Ray cluster has {available:g}"
        )
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={**config, "threads_per_worker": 1, "core_binding": binding},
        scaling_config=ScalingConfig(
            num_workers=world_size,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": 1},
            label_selector=worker_label_selectors(placement, world_size),
        ),
        run_config=RunConfig(name=name, storage_path=str(Path(storage or home_path("ray_results")).resolve())),
    )
    metrics = trainer.fit().return_value  # rank 0's
    if metrics is None:
        raise RuntimeError("the training job finished without reporting its timings")
    return metrics

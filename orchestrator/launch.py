"""Launching the real job with a plan: Ray Train's TorchTrainer over the same Ray cluster.

Each worker builds its rank of the sharded DLRM (probes.workloads.dlrm), or of the parallel
transformer block stack (probes.workloads.transformer), on the process group Ray Train set up
(NCCL with GPUs, gloo without) and times `iterations` steps after warm-up. The reported
iteration time is the median over steps of the slowest rank's step time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from predictors.table_shards import ShardingPlanError, is_table_wise
from probes.jobspec import JobSpec


@dataclass
class LaunchResult:
    iteration_ms: float
    iterations: int
    per_iteration_ms: list[float]
    loss_first: float
    loss_last: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(config["threads_per_worker"])
    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if "transformer" in config:
        from probes.workloads.transformer import ParallelTransformer, TransformerSpec

        model = ParallelTransformer(TransformerSpec.from_dict(config["transformer"]), ctx.get_world_rank(), device)
    else:
        from probes.workloads.dlrm import ShardedDLRM

        spec = JobSpec.from_dict(config["job"])
        model = ShardedDLRM(spec, config["table_to_rank"], ctx.get_world_rank(), ctx.get_world_size(), device)
    result = model.run(config["iterations"], config["warmup"])
    metrics = {
        "iteration_ms": result.median_s * 1e3,
        "per_iteration_ms": [t * 1e3 for t in result.iteration_s],
        "loss_first": result.losses[0],
        "loss_last": result.losses[-1],
    }
    if ctx.get_world_rank() == 0:
        ray.get(config["collector"].put.remote(metrics))
    ray.train.report(metrics)


class _ResultCollector:
    """Holds rank 0's metrics: Ray Train's Result keeps metrics only beside checkpoints."""

    def __init__(self) -> None:
        self.metrics: dict[str, Any] | None = None

    def put(self, metrics: dict[str, Any]) -> None:
        self.metrics = metrics

    def get(self) -> dict[str, Any] | None:
        return self.metrics


def launch_dlrm(
    spec: JobSpec, table_to_rank: Sequence[int], iterations: int | None = None, use_gpu: bool = False,
    storage: str | Path = ".autotune/ray_results",
) -> LaunchResult:
    if not is_table_wise(table_to_rank):
        raise ShardingPlanError("the reference DLRM workload runs table-wise plans only (one rank per table); "
                                "row-wise, column-wise and data-parallel entries can be predicted, not launched")
    config = {"job": spec.to_dict(), "table_to_rank": list(table_to_rank),
              "iterations": iterations or spec.iterations, "warmup": spec.warmup_iterations}
    return _launch(config, spec.world_size, f"dlrm-{spec.name}", use_gpu, storage)


def launch_transformer(
    spec: Any, iterations: int | None = None, use_gpu: bool = False, storage: str | Path = ".autotune/ray_results",
) -> LaunchResult:
    """Run a `TransformerSpec` (data x tensor parallel) for real and time it."""
    config = {"transformer": spec.to_dict(), "iterations": iterations or spec.iterations,
              "warmup": spec.warmup_iterations}
    return _launch(config, spec.world_size, f"transformer-{spec.name}", use_gpu, storage)


def _launch(config: dict[str, Any], world_size: int, name: str, use_gpu: bool, storage: str | Path) -> LaunchResult:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    available = ray.cluster_resources().get("GPU" if use_gpu else "CPU", 0)
    if available < world_size:
        raise RuntimeError(
            f"job needs world_size={world_size} {'GPU' if use_gpu else 'CPU'} workers, "
            f"the Ray cluster has {available:g}"
        )
    collector = ray.remote(num_cpus=0)(_ResultCollector).remote()
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={**config, "threads_per_worker": 1, "collector": collector},
        scaling_config=ScalingConfig(num_workers=world_size, use_gpu=use_gpu, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(Path(storage).resolve())),
    )
    trainer.fit()
    metrics = ray.get(collector.get.remote())
    ray.kill(collector)
    if metrics is None:
        raise RuntimeError("the training job finished without reporting its timings")
    return LaunchResult(
        float(metrics["iteration_ms"]), config["iterations"], list(metrics["per_iteration_ms"]),
        float(metrics["loss_first"]), float(metrics["loss_last"]),
    )

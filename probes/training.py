"""The training probe: a few real training steps of a DLRM (any plan) or a transformer block
stack on a gang's process group, giving the step time, the per-op CPU overheads
(`probes.overheads`) and the in-context kernel times of a captured step; the points it is
swept over (small random models for the framework overhead, the tasks' tables under little
work for what many large tables cost beyond their kernels, production-shaped random tasks for
the kernels' slowdown beside each other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from probes.overheads import profile_overheads
from probes.probe import ProbeSpec, SoloGangProbe
from probes.trace_capture import capture_step_trace
from probes.vocabulary.in_context import in_context_rows, in_step_collectives, step_collectives, tbe_in_context_rows
from probes.vocabulary.ops import FRAMEWORK_JOB_PREFIX, TASK_JOB_PREFIX, task_job
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.records import Measurement
from probes.vocabulary.table_shards import split_kinds
from probes.workloads.dlrm import cycling_step
from probes.workloads.random_dlrm import BATCH_SIZES, random_dlrm_job

# The random-task generator's seed stream for calibration probes: disjoint from the streams
# the evaluation benchmarks draw their tasks from (their seeds are small integers).
CALIBRATION_TASK_STREAM = 1_000_003


def random_plan(job: dict, world: int, rng: np.random.Generator, mixed: bool) -> list:
    """A random plan of a job dict: every table on a random rank, or (`mixed`) a third of the
    tables row-wise, column-wise or replicated (where the table allows it) and the rest on
    random ranks."""
    plan: list = [int(r) for r in rng.integers(0, world, size=len(job["tables"]))]
    if not mixed or world < 2:
        return plan
    for j, t in enumerate(job["tables"]):
        kinds = split_kinds(t["num_embeddings"], t["embedding_dim"], world)
        if rng.random() < 1 / 3 and kinds:
            plan[j] = {"type": str(rng.choice(kinds))}
    return plan


TaskPlacer = Callable[[dict, int, int], list]  # (job dict, world, k) -> a table-wise plan


LIGHT_BATCH_SIZES = (16, 32, 64, 128)  # the light probes' batches: task tables, little work each


def probe_kind(i: int) -> str:
    """Which kind `training_specs`' point i is: "task" (odd i), else "overhead" and "light" in
    turn."""
    if i % 2:
        return TASK_JOB_PREFIX
    return "light" if (i // 2) % 2 else "overhead"


def job_kind(name: str) -> str:
    """A training probe's kind from its job's name: `training_specs` names each job by its kind
    and index (task7, light2, overhead0), and a stored row keeps only the name."""
    return name.rstrip("0123456789")


def table_wise_task(row: Measurement) -> bool:
    """Whether a stored DLRM step is a task-shaped probe's with every table on one rank: the
    calibration's steps most like a run's tasks, whose plans the sharders choose."""
    return task_job(row.params["job"]) and all(isinstance(p, int) for p in row.params["table_to_rank"])


def training_specs(
    n: int, seed: int, world: int, place_task: TaskPlacer | None = None, task_scale: float = 1.0
) -> list[ProbeSpec]:
    """Real DLRM training steps of three kinds, so the step model sees both ends and what
    lies between (`probe_kind`: task, overhead, task, light, ...):

    - small random DLRMs whose kernels are tiny, so the gap between a measured step and the
      sum of its predicted kernels is the per-iteration, per-layer and per-table framework
      overhead;
    - light steps on the tables tasks have: the first 1..all tables of a task from the same
      generator, at a batch of 16-128 (`LIGHT_BATCH_SIZES`), on random ranks. What a step of
      many large tables leaves over its kernels was measured only on task probes, three of
      twelve of them light enough to show it, so the overhead of small jobs was learned from
      tiny tables: at the 11-27 20:00 calibration of #26 the steps of 18-31 large tables left
      4.4-8.8 ms over their kernels whatever those were (2.6-47 ms), the tiny-table steps
      1.2-3.7 ms, and the run's 10-22 ms tasks were priced 7-25% low;
    - production-shaped tasks from the random-task generator (`random_dlrm_job`, its own
      seed stream) at `task_scale` (full size unless the devices cannot hold them:
      `task_indices` and `random_dlrm.fitting_scale`), whose steps are dominated by kernels
      and collectives, so the slowdown they suffer beside each other in a real step, on
      tables as large as users have and at every batch size in turn, is measured, not
      extrapolated: one probe per batch size table-wise, then one per batch size with a
      mixed plan (`random_plan`, `task_is_mixed`), and so on; every table-wise one placed
      by `place_task` (the orchestrator passes the classic sharders, in turn: the plans the
      policies price, mostly balanced, where both ranks compute at once and slow each other
      on a small host), the mixed ones on random ranks. Until 11-27 only every other
      table-wise one was: left out in turn, the sharder-placed task steps of three
      calibrations of #26 leaned -3.7%, -7.5%, -6.8% and those on random ranks +4.4%, +3.7%,
      +2.8%, and their runs' tasks, all placed by the policy, -7.2%, -8.9%, -5.8%.
    """
    rng = np.random.default_rng(seed + 2)
    out = []
    placed = 0  # task probes placed by `place_task` so far (the sharders in turn)
    for i in range(n):
        kind = probe_kind(i)
        if kind == "overhead":
            job = overhead_job(i, world, rng)
        else:
            job = random_dlrm_job(i, world, seed=seed + CALIBRATION_TASK_STREAM, scale=task_scale)
            job["name"] = f"{kind}{i}"
        if kind == "light":
            job["tables"] = job["tables"][: int(rng.integers(1, len(job["tables"]) + 1))]
            job["batch_size"] = int(rng.choice(LIGHT_BATCH_SIZES))
        if kind != TASK_JOB_PREFIX:  # the overhead and light ones on random ranks
            placement: list = [int(r) for r in rng.integers(0, world, size=len(job["tables"]))]
        else:
            k = i // 2  # the task-shaped probe's own index
            # the batch sizes in turn: a draw can give one size to every early probe (a 300 s
            # calibration measured three task probes, all at 1024), and small batches on large
            # tables are where a step's framework and exchange waits weigh most
            job["batch_size"] = BATCH_SIZES[k % len(BATCH_SIZES)]
            # every batch size table-wise first, then every one with a mixed plan (row-/column-
            # wise and replicated tables, the collectives and TBEs of the plans the sharding
            # search tries), and so on: with a period of two for both, batches 256 and 1024 were
            # only ever measured mixed, and the step model priced table-wise 1024-batch jobs from
            # mixed steps alone (issue #26: 24-33% over)
            mixed = task_is_mixed(k)
            placement = random_plan(job, world, rng, mixed=mixed)
            if place_task is not None and not mixed:
                placement = [int(r) for r in place_task(job, world, placed)]
                placed += 1
        out.append(ProbeSpec("training", {"job": job, "table_to_rank": placement}, f"train:{i}"))
    return out


def overhead_job(i: int, world: int, rng: np.random.Generator) -> dict:
    """A small random DLRM (1-12 tables of 100-2000 rows, batch 16-128, narrow MLPs): its
    kernels are tiny, so its step over them is the framework's overhead."""
    n_tables = int(rng.integers(1, 13))
    return {
        "name": f"{FRAMEWORK_JOB_PREFIX}{i}",
        "workload": "dlrm",
        "world_size": world,
        "batch_size": int(rng.choice([16, 32, 64, 128])),
        "seed": i,
        "dense": {
            "num_dense_features": int(rng.integers(4, 17)),
            "bottom_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(1, 5)))],
            "top_mlp": [int(rng.choice([16, 32, 64])) for _ in range(int(rng.integers(0, 4)))] + [1],
        },
        "tables": [
            {
                "name": f"t{j}",
                "num_embeddings": int(rng.integers(100, 2000)),
                "embedding_dim": int(rng.choice([4, 8, 16])),
                "pooling_factor": int(rng.integers(1, 5)),
                "distribution": "uniform",
            }
            for j in range(n_tables)
        ],
    }


def task_is_mixed(k: int) -> bool:
    """Whether the k-th task-shaped training probe has a mixed plan: blocks of one probe per
    batch size, table-wise and mixed in turn."""
    return (k // len(BATCH_SIZES)) % 2 == 1


def task_indices(n: int) -> list[int]:
    """The indices of `training_specs(n, ...)`'s points whose tables the task generator draws
    (task and light ones): the memory must hold each of them (`random_dlrm.fitting_scale`)."""
    return [i for i in range(n) if probe_kind(i) != "overhead"]


# Which transformer probes (by index mod 4) train under bfloat16 autocast: on a GPU half of
# them, small and task-shaped alike. On CPU none for now: bfloat16 steps do work there (on the
# AVX512-BF16 development host 0.5-1.4x the float32 step), but the in-context rows of a captured
# step are labelled float32 whatever the step ran in (probes/vocabulary/in_context.py), so they would skew
# the float32 context factors, and a CPU without bf16 units emulates the products (~50x
# slower). (2,) here would probe every other small stack once those rows carry their dtype.
# float16 (a GradScaler, CUDA only) is not probed: jobs train in bfloat16.
_TRAINING_BF16_SLOTS: dict[str, tuple[int, ...]] = {"cpu": (), "cuda": (2, 3)}


# The layouts some transformer probes train under, in turn, so the step overhead is fitted on
# every kind of layout a plan may choose, not extrapolated from data parallel; "world": as many
# as the probe has ranks. A layout the probe's job cannot take falls back to data parallel.
# The layouts whose framework work differs most from data parallel's come first (a short
# budget measures only the first few): TP's autograd all-reduces, FSDP's per-block hooks.
PROBE_LAYOUTS: tuple[dict[str, Any], ...] = (
    {"tensor_parallel": "world"},
    {"fsdp": "full_shard"},
    {"pipeline_parallel": 2, "micro_batches": 2},
    {"fsdp": "shard_grad_op", "micro_batches": 2},
    {"micro_batches": 2, "recompute": True},
    {"tensor_parallel": "world", "micro_batches": 2},
)


def probe_layout(job: Any, k: int) -> dict[str, Any]:
    """Layout k (in turn) of `job` (a `TransformerJob`) as a spec dict, or its data-parallel
    spec where the job does not divide that way."""
    from probes.vocabulary.transformer_spec import TransformerSpecError

    layout = {key: job.world_size if v == "world" else v for key, v in PROBE_LAYOUTS[k % len(PROBE_LAYOUTS)].items()}
    try:
        return job.spec(**layout).to_dict()
    except TransformerSpecError:
        return job.spec().to_dict()


SMALL_HIDDEN = (64, 128, 256)  # the small stacks' widths, in turn (the random tasks' range)


def small_transformer_probe(i: int, world: int) -> bool:
    """Whether `transformer_training_specs`' point i is a small data-parallel stack: every
    fourth point, and on one rank (no layout to try) every other one. Its spec keeps the name
    `probe<i>`, so a stored step's kind is read back from it."""
    return i % 4 == 0 or (i % 4 == 2 and world == 1)


def transformer_training_specs(n: int, seed: int, world: int, device_kind: str = "cpu") -> list[ProbeSpec]:
    """Block stacks whose steps fit the transformer step overhead and whose captured steps give
    the in-context times of its kernels (gelu, softmax, layer_norm and their backward, batched
    GEMMs). In turn: small data-parallel stacks, task-shaped ones from the random-task
    generator (its own seed stream), so the step model is not extrapolated to the sizes jobs
    have, and every other small and task-shaped one a random job under one of the layouts a
    plan may choose (`PROBE_LAYOUTS`); some in bfloat16 mixed precision (`_TRAINING_BF16_SLOTS`)."""
    from probes.vocabulary.transformer_job import random_transformer_job
    from probes.vocabulary.transformer_spec import random_transformer

    bf16_slots = _TRAINING_BF16_SLOTS["cuda" if device_kind.startswith("cuda") else "cpu"]
    rng = np.random.default_rng(seed + 3)
    out = []
    small = 0  # small stacks so far
    for i in range(n):
        dtype = "bfloat16" if i % 4 in bf16_slots else "float32"
        if i % 4 == 1:
            spec = random_transformer(i, world, 1, seed + CALIBRATION_TASK_STREAM).to_dict()
        elif not small_transformer_probe(i, world):
            job = random_transformer_job(i, world, seed + CALIBRATION_TASK_STREAM)
            spec = probe_layout(job, (i // 4) * 2 + (i % 4 == 3))  # the layouts in turn
        else:
            # width and depth in turn, smallest first: a 300 s calibration measures two small
            # stacks, and two random draws at hidden 256 left the step overhead fitted on steps
            # of 12 ms and up, then priced a 2 ms job 58% over
            spec = {
                "layers": 1 + small % 2,
                "hidden": SMALL_HIDDEN[small % len(SMALL_HIDDEN)],
                "heads": int(rng.choice([2, 4])),
                # drawn: in turn (128 first, then 32, 128, 64) two cycles leaned the transformer
                # e2e +10.1% and +12.7% (11-27, README), the small jobs priced 15-24% over
                "seq_len": int(rng.choice([32, 64, 128])),
                "batch_size": int(rng.choice([2, 4])),
                "world_size": world,
                "tensor_parallel": 1,
                "dropout": 0.1,
                "seed": i,
            }
            small += 1
        spec.update(name=f"probe{i}", dtype=dtype)
        out.append(ProbeSpec("training", {"transformer": spec}, f"train-transformer:{i}:{dtype}"))
    return out


def run_training_probe(
    spec: ProbeSpec, device: str = "cpu", iterations: int = 30, warmup: int = 5
) -> list[Measurement]:
    """A few real training steps on the current process group; rank 0 returns the step time,
    the per-op CPU overheads and the in-context kernel times of a captured step; the step row
    also carries its captured steps' collectives with their in-step times (every rank's
    gathered: `in_step_collectives`)."""
    import torch.distributed as dist

    if "transformer" in spec.params:
        from probes.vocabulary.transformer_spec import TransformerSpec
        from probes.workloads.transformer import ParallelTransformer

        model: Any = ParallelTransformer(
            TransformerSpec.from_dict(spec.params["transformer"]), dist.get_rank(), torch.device(device)
        )
        step_op, workload, step = "transformer_step", "transformer", model.step
        lookup = None
        iterations = min(iterations, 10)
        params = {"transformer": spec.params["transformer"]}
    else:
        from probes.vocabulary.jobspec import JobSpec
        from probes.workloads.dlrm import ShardedDLRM

        plan = spec.params["table_to_rank"]
        model = ShardedDLRM(
            JobSpec.from_dict(spec.params["job"]), plan, dist.get_rank(), dist.get_world_size(), torch.device(device)
        )
        step_op, workload, step = "dlrm_step", "dlrm", cycling_step(model)
        lookup = model.lookup_features() if dist.get_rank() == 0 else None  # priced in its captured steps
        params = {"job": spec.params["job"], "table_to_rank": plan}
    if "placement" in spec.params:  # the node of each rank, set by the gang that ran it
        params["placement"] = spec.params["placement"]
    try:
        result = model.run(iterations, warmup)
        # Every rank profiles (the steps hold collectives); rank 0 reports.
        overheads = profile_overheads(step, iterations=5, warmup=0, device=device, workload=workload)
        trace = capture_step_trace(step, iterations=3, warmup=0, barrier=dist.barrier)
        # every rank's collectives, for their in-step times (`in_step_collectives`)
        per_rank: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, step_collectives(trace["steps"]))
    finally:
        if hasattr(model, "close"):
            model.close()  # its subgroups: a calibration builds many models on one process group
    if dist.get_rank() != 0:
        return []
    # each workload's captured collectives set its own in-step prices (`predictors.collective_context`)
    params["in_step_collectives"] = in_step_collectives(per_rank)
    times = np.asarray(result.iteration_s)
    q1, q3 = np.percentile(times, [25, 75])
    world = dist.get_world_size()
    return (
        [
            Measurement(
                step_op,
                params,
                float(np.median(times)),
                float(q3 - q1),
                len(times),
                device=device,
                world_size=world,
                family="training",
            )
        ]
        + overheads
        + (in_context_rows(trace["steps"], device, world, workload) if float32_step(spec) else [])
        + (tbe_in_context_rows(trace["steps"], lookup, device, world, workload) if lookup is not None else [])
    )


def float32_step(spec: ProbeSpec) -> bool:
    """Whether a training probe's captured kernels run in float32: the in-context rows price
    them with the float32 probe models (a bfloat16 step's kernels would skew those factors)."""
    return spec.params.get("transformer", {}).get("dtype", "float32") == "float32"


@dataclass(frozen=True)
class TrainingProbe(SoloGangProbe):
    """Training steps on a gang: a batch of one point, run once (not per pass); a point records
    the node of every rank, so its step is priced on the curves of the scopes it ran at."""

    family: str = "training"

    def placed(self, spec: ProbeSpec, placement: RankPlacement) -> ProbeSpec:
        return ProbeSpec(spec.family, {**spec.params, "placement": placement.to_dict()}, spec.key)

    def run(self, specs: Sequence[ProbeSpec], device: str, timing: dict[str, Any] | None = None) -> list[Measurement]:
        return [row for spec in specs for row in run_training_probe(spec, device)]


PROBE = TrainingProbe()

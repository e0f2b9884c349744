"""TorchRec interoperability: its planner as a baseline, and our plans as its `ShardingPlan`.

torchrec is an optional extra (`pip install -e .[torchrec]`); this module imports it lazily
so the rest of the policy runs without it.

- `torchrec_plan(job, cap)`: what TorchRec's own `EmbeddingShardingPlanner` picks for the
  job's tables (its fixed-constant cost model), converted to our plan entries so the same
  workload can run it: the baseline the sharding policy is measured against.
- `to_sharding_plan(job, plan)` / `from_sharding_plan(job, sharding_plan)`: our plan as a
  TorchRec `ShardingPlan` for an `EmbeddingBagCollection` of the job's tables (one feature per
  table, named after it), and back, so a TorchRec user applies our choice with
  `DistributedModelParallel(model, plan=...)` as it is.

On one node TorchRec's table-row-wise is row-wise over the node's ranks, so it reads back as
row-wise; a column-wise table whose TorchRec shards sit on fewer ranks than shards reads back
as column-wise over those ranks (our workload splits columns evenly over distinct ranks).
"""
from __future__ import annotations

from typing import Any, Sequence

from probes.jobspec import JobSpec
from probes.table_shards import COLUMN_WISE, DATA_PARALLEL, ROW_WISE, PlanEntry, table_shards

# Sharding types TorchRec may choose for our workload (table-row-wise: see above).
TORCHREC_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


def feature_name(table_name: str) -> str:
    return f"{table_name}_ids"


def embedding_bag_collection(job: JobSpec, device: str = "meta"):
    """The job's tables as a TorchRec `EmbeddingBagCollection` (on the meta device: no memory)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                  feature_names=[feature_name(t.name)]) for t in job.tables]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def torchrec_plan(job: JobSpec, memory_cap_bytes: float, compute_device: str = "cuda") -> list[PlanEntry]:
    """TorchRec's planner's choice for the job, as our plan entries.

    The planner is given what it can use: world size, per-rank batch, each table's pooling
    factor, and the per-rank memory cap as its HBM; everything else is its own constants
    (it runs on CPU; `compute_device="cuda"` is the device class it costs for, the one its
    constants describe).
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    W = job.world_size
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=W, local_world_size=W, hbm_cap_bytes=int(min(memory_cap_bytes, 2**50))),
        kernel_config=KernelConfig(compute_device=compute_device))
    constraints = {t.name: ParameterConstraints(sharding_types=list(TORCHREC_TYPES),
                                                pooling_factors=[float(t.pooling_factor)]) for t in job.tables}
    # The cap already is the embeddings' share of a device (orchestrator.planning), so nothing
    # more is reserved; debug=False skips the planner's printed stats table.
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=job.batch_size, constraints=constraints,
                                       storage_reservation=FixedPercentageStorageReservation(0.0), debug=False)
    plan = planner.plan(embedding_bag_collection(job), [EmbeddingBagCollectionSharder()])
    return from_sharding_plan(job, plan)


def from_sharding_plan(job: JobSpec, sharding_plan: Any, module_path: str = "") -> list[PlanEntry]:
    """A TorchRec `ShardingPlan` of the job's `EmbeddingBagCollection` as our plan entries."""
    module_plan = sharding_plan.plan[module_path]
    out: list[PlanEntry] = []
    for t in job.tables:
        if t.name not in module_plan:
            raise ValueError(f"the TorchRec plan has no entry for table {t.name!r}")
        ps = module_plan[t.name]
        kind, ranks = str(ps.sharding_type), [int(r) for r in (ps.ranks or [])]
        if kind == "table_wise":
            out.append(ranks[0])
        elif kind in ("row_wise", "table_row_wise"):
            out.append({"type": ROW_WISE})
        elif kind in ("column_wise", "table_column_wise"):
            distinct = list(dict.fromkeys(ranks))
            out.append(distinct[0] if len(distinct) == 1 else {"type": COLUMN_WISE, "ranks": distinct})
        elif kind == "data_parallel":
            out.append({"type": DATA_PARALLEL})
        else:
            raise ValueError(f"table {t.name!r}: TorchRec sharding type {kind!r} is not one of {TORCHREC_TYPES}")
    table_shards(job, out)  # the converted plan must be a valid plan of the job
    return out


def to_sharding_plan(job: JobSpec, plan: Sequence[PlanEntry], device_type: str = "cuda", module_path: str = ""):
    """Our plan as a TorchRec `ShardingPlan` for the job's `EmbeddingBagCollection`."""
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan

    table_shards(job, plan)
    per_table = {}
    for t, entry in zip(job.tables, plan):
        if isinstance(entry, int):
            per_table[t.name] = table_wise(rank=entry)
        elif entry["type"] == ROW_WISE:
            per_table[t.name] = row_wise()
        elif entry["type"] == COLUMN_WISE:
            per_table[t.name] = column_wise(ranks=list(entry.get("ranks", range(job.world_size))))
        elif entry["type"] == DATA_PARALLEL:
            per_table[t.name] = data_parallel()
        else:
            per_table[t.name] = table_wise(rank=int(entry["ranks"][0]))
    module_plan = construct_module_sharding_plan(
        embedding_bag_collection(job), per_param_sharding=per_table, local_size=job.world_size,
        world_size=job.world_size, device_type=device_type)
    return ShardingPlan({module_path: module_plan})

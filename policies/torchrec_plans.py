"""Our plans as TorchRec `ShardingPlan`s and back, and the plan file a TorchRec user loads.

- `to_sharding_plan(job, plan)` / `from_sharding_plan(job, sharding_plan)`: our plan as a
  TorchRec `ShardingPlan` for an `EmbeddingBagCollection` of the job's tables (one feature per
  table, named after it), and back, so a TorchRec user applies our choice with
  `DistributedModelParallel(model, plan=...)` as it is;
- `torchrec_plan_record(job, plan, placement)` / `load_torchrec_plan(record)`: the same as plain
  JSON (`python -m orchestrator.cli.plan --torchrec-plan-out FILE`) and the `ShardingPlan` it
  becomes, on the user's own module.

torchrec is imported lazily. On one node TorchRec's table-row-wise is row-wise over the node's
ranks, so it reads back as row-wise; a column-wise table whose TorchRec shards sit on fewer ranks
than shards reads back as column-wise over those ranks (our workload splits columns evenly over
distinct ranks).
"""

from __future__ import annotations

from typing import Any, Sequence

from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.table_shards import COLUMN_WISE, DATA_PARALLEL, ROW_WISE, PlanEntry, table_shards

# Sharding types TorchRec may choose for our workload (table-row-wise: see above).
TORCHREC_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")


def feature_name(table_name: str) -> str:
    return f"{table_name}_ids"


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


TORCHREC_PLAN_FORMAT = "cluster-autotune/torchrec-sharding-plan/v1"


def torchrec_plan_record(
    job: JobSpec, plan: Sequence[PlanEntry], placement: RankPlacement | None = None, device_type: str = "cuda"
) -> dict[str, Any]:
    """Our plan as plain data a TorchRec user turns into a `ShardingPlan` (`load_torchrec_plan`):
    per table its TorchRec sharding type and ranks, the tables' shapes, the world and the ranks
    per node (TorchRec's `local_size`: which ranks share a host decides what row-wise and
    table-row-wise mean). Stored as JSON, not a pickle: loading it runs no code of ours."""
    table_shards(job, plan)  # a bad plan fails here, naming the entry
    placement = placement or RankPlacement.single_node(job.world_size)
    tables: dict[str, dict[str, Any]] = {}
    for t, entry in zip(job.tables, plan):
        if isinstance(entry, int):
            tables[t.name] = {"sharding_type": "table_wise", "ranks": [int(entry)]}
        elif entry["type"] == ROW_WISE:
            tables[t.name] = {"sharding_type": "row_wise"}
        elif entry["type"] == COLUMN_WISE:
            tables[t.name] = {
                "sharding_type": "column_wise",
                "ranks": [int(r) for r in entry.get("ranks", range(job.world_size))],
            }
        elif entry["type"] == DATA_PARALLEL:
            tables[t.name] = {"sharding_type": "data_parallel"}
        else:
            tables[t.name] = {"sharding_type": "table_wise", "ranks": [int(entry["ranks"][0])]}
    return {
        "format": TORCHREC_PLAN_FORMAT,
        "module_path": "",
        "world_size": job.world_size,
        # TorchRec assumes every host has as many ranks; a placement with uneven nodes gives its largest
        "local_world_size": max(placement.ranks_per_node().values()),
        "device_type": device_type,
        "embedding_bags": [
            {
                "name": t.name,
                "num_embeddings": t.num_embeddings,
                "embedding_dim": t.embedding_dim,
                "feature_names": [feature_name(t.name)],
            }
            for t in job.tables
        ],
        "tables": tables,
    }


def load_torchrec_plan(record: dict[str, Any], module: Any = None):
    """A `ShardingPlan` for `DistributedModelParallel(module, plan=...)` from a record written by
    `torchrec_plan_record` (`python -m orchestrator.cli.plan --torchrec-plan-out FILE`).
    `module`: the user's `EmbeddingBagCollection` (default: one on the meta device built from
    the record's tables); its tables must be the record's."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan

    if record.get("format") != TORCHREC_PLAN_FORMAT:
        raise ValueError(f"format: expected {TORCHREC_PLAN_FORMAT!r}, got {record.get('format')!r}")
    if module is None:
        configs = [EmbeddingBagConfig(**bag) for bag in record["embedding_bags"]]
        module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    known = {c.name for c in module.embedding_bag_configs()}
    if known != set(record["tables"]):
        raise ValueError(f"tables: the plan shards {sorted(record['tables'])}, the module holds {sorted(known)}")
    kinds = {
        "table_wise": lambda t: table_wise(rank=t["ranks"][0]),
        "row_wise": lambda t: row_wise(),
        "column_wise": lambda t: column_wise(ranks=t["ranks"]),
        "data_parallel": lambda t: data_parallel(),
    }
    per_table = {}
    for name, t in record["tables"].items():
        if t["sharding_type"] not in kinds:
            raise ValueError(
                f"tables.{name}.sharding_type: expected one of {sorted(kinds)}, got {t['sharding_type']!r}"
            )
        per_table[name] = kinds[t["sharding_type"]](t)
    module_plan = construct_module_sharding_plan(
        module,
        per_param_sharding=per_table,
        local_size=int(record["local_world_size"]),
        world_size=int(record["world_size"]),
        device_type=record["device_type"],
    )
    return ShardingPlan({record["module_path"]: module_plan})


def to_sharding_plan(
    job: JobSpec, plan: Sequence[PlanEntry], device_type: str = "cuda", placement: RankPlacement | None = None
):
    """Our plan as a TorchRec `ShardingPlan` for the job's `EmbeddingBagCollection`."""
    return load_torchrec_plan(torchrec_plan_record(job, plan, placement, device_type))

"""TorchRec's planner as a baseline, and as a planner on our measured costs.

torchrec is an optional extra (`pip install -e .[torchrec]`); this module imports it lazily
so the rest of the policy runs without it.

- `torchrec_plan(job, cap)`: what TorchRec's own `EmbeddingShardingPlanner` picks for the
  job's tables (its fixed-constant cost model), converted to our plan entries so the same
  workload can run it: the baseline the sharding policy is measured against.
- `measured_estimator(job, model, topology)`: a TorchRec `ShardEstimator` that prices every
  shard from our calibrated `PerformanceModel` (measured TBE lookups with the table's reuse
  statistics, measured collective curves) instead of TorchRec's bandwidth constants, so
  TorchRec's own planner can run on this hardware's measurements (`torchrec_plan(...,
  model=...)`);

Our plans as TorchRec `ShardingPlan`s, and the plan file a TorchRec user loads:
`policies.torchrec_plans`.
"""

from __future__ import annotations

import math
from typing import Any

from policies.sharders import NoFeasiblePlanError
from policies.torchrec_plans import TORCHREC_TYPES, feature_name, from_sharding_plan
from probes.vocabulary.jobspec import JobSpec, TableShape, TableSpec
from probes.vocabulary.placement import INTRA, RankPlacement
from probes.vocabulary.table_shards import PlanEntry
from probes.vocabulary.tbe_features import expected_features


def embedding_bag_collection(job: JobSpec, device: str = "meta"):
    """The job's tables as a TorchRec `EmbeddingBagCollection` (on the meta device: no memory)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=[feature_name(t.name)],
        )
        for t in job.tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


_UNFIT_MS = 1e30  # the price of a shard that cannot fit (finite: TorchRec sums prices)


class _ShardPricer:
    """Seconds of one shard's lookups and collectives as our workload runs it, from a `PerformanceModel`."""

    def __init__(self, job: JobSpec, model: Any, world: int, scope: str) -> None:
        self.job, self.model, self.world, self.scope = job, model, world, scope

    def marginal(self, op: str, nbytes: float) -> float:
        """The time a collective adds for `nbytes`: its curve at those bytes minus its latency floor."""
        W, scope = self.world, self.scope
        floor = self.model.predict(op, bytes=8, world=W, scope=scope)
        return max(self.model.predict(op, bytes=max(int(nbytes), 8), world=W, scope=scope) - floor, 0.0)

    def lookup(self, shape: TableShape, batch: int) -> tuple[float, float]:
        """The embedding forward and backward of one table piece over `batch` samples."""
        feats = expected_features([shape], batch, seed=self.job.seed)
        return self.model.predict("embedding_fwd", **feats), self.model.predict("embedding_bwd", **feats)

    def price(
        self, table: TableSpec, kind: str, batch: int, rows: int, cols: int
    ) -> tuple[float, float, tuple[float, float]]:
        """(forward, backward, (forward comms, backward comms)) of a `rows` x `cols` shard of
        `table` sharded as `kind`, `batch` samples per rank."""
        W = self.world
        if kind in ("row_wise", "table_row_wise"):
            shape = TableShape(rows, cols, max(1, round(table.pooling_factor / W)), table.distribution)
            fwd, bwd = self.lookup(shape, batch * W)
            exchanged = 4 * batch * W * cols
            comms = (self.marginal("reduce_scatter", exchanged), self.marginal("all_gather", exchanged))
        elif kind == "data_parallel":
            fwd, bwd = self.lookup(TableShape(rows, cols, table.pooling_factor, table.distribution), batch)
            comms = (0.0, self.marginal("all_reduce", 4 * rows * cols))
        else:  # table-wise, column-wise: the global batch, pooled columns exchanged
            fwd, bwd = self.lookup(TableShape(rows, cols, table.pooling_factor, table.distribution), batch * W)
            a2a = self.marginal("all_to_all", 4 * batch * W * cols)
            comms = (a2a, a2a)
        return fwd, bwd, comms


def measured_estimator(
    job: JobSpec, model: Any, world_size: int, scope: str = INTRA, max_shard_bytes: float | None = None
):
    """A TorchRec `ShardEstimator` pricing shards with our `PerformanceModel` (milliseconds).

    Per shard, as our workload runs it: table- and column-wise pieces look up the global batch
    and send their pooled columns in the all-to-all (forward and back); row-wise pieces look up
    the global batch's ids in their rows (pooling / ranks per bag) and reduce-scatter the
    partial sums (all-gather backward); replicas look up the local batch and all-reduce their
    dense gradient. TorchRec sums shard costs per rank, so a collective is priced by the time
    it adds for the shard's bytes (the measured curve at those bytes minus its latency floor),
    not a whole collective per shard.

    A shard whose weights alone exceed `max_shard_bytes` (the per-rank cap) is not priced:
    TorchRec's storage check drops it anyway, and sampling a typical batch of a table too
    large for any rank costs memory in proportion to its rows.
    """
    from torchrec.distributed.planner.types import Perf, ShardEstimator

    tables = {t.name: t for t in job.tables}
    pricer = _ShardPricer(job, model, world_size, scope)

    class MeasuredPerfEstimator(ShardEstimator):
        def __init__(self, topology: Any = None, constraints: Any = None) -> None:
            self.topology, self.constraints = topology, constraints

        def estimate(self, sharding_options: list, sharder_data_map: Any = None) -> None:
            for option in sharding_options:
                table = tables[option.name]
                B = option.batch_size  # per rank
                kind = str(option.sharding_type)
                for shard in option.shards:
                    rows, cols = int(shard.size[0]), int(shard.size[1])
                    if max_shard_bytes is not None and 4 * rows * cols > max_shard_bytes:
                        shard.perf = Perf(fwd_compute=_UNFIT_MS, fwd_comms=0.0, bwd_compute=_UNFIT_MS, bwd_comms=0.0)
                        continue
                    fwd, bwd, comms = pricer.price(table, kind, B, rows, cols)
                    shard.perf = Perf(
                        fwd_compute=fwd * 1e3, fwd_comms=comms[0] * 1e3, bwd_compute=bwd * 1e3, bwd_comms=comms[1] * 1e3
                    )

    return MeasuredPerfEstimator()


def _planner_topology(world: int, placement: RankPlacement, memory_cap_bytes: float, compute_device: str) -> Any:
    """TorchRec's view of the ranks: world size, ranks per node, and the cap as each one's HBM."""
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world,
            local_world_size=max(placement.ranks_per_node().values()),
            hbm_cap_bytes=int(min(memory_cap_bytes, 2**50)),
        ),
        kernel_config=KernelConfig(compute_device=compute_device),
    )


def _table_constraints(job: JobSpec, model: Any) -> dict[str, Any]:
    """Per table, the sharding types the planner may choose (no row-wise pieces when `model`
    cannot price their collectives) and its pooling factor."""
    from torchrec.distributed.planner import ParameterConstraints

    types = list(TORCHREC_TYPES)
    if model is not None and not {"reduce_scatter", "all_gather"} <= set(model.models):
        types = [t for t in types if "row_wise" not in t]  # row-wise pieces could not be priced
    return {
        t.name: ParameterConstraints(sharding_types=types, pooling_factors=[float(t.pooling_factor)])
        for t in job.tables
    }


def _measured_enumerator(
    job: JobSpec, model: Any, topology: Any, constraints: dict[str, Any], scope: str, memory_cap_bytes: float
) -> Any:
    """TorchRec's enumerator, its shards priced by our measurements and sized by TorchRec."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

    return EmbeddingEnumerator(
        topology=topology,
        batch_size=job.batch_size,
        constraints=constraints,
        estimator=[
            measured_estimator(job, model, job.world_size, scope, max_shard_bytes=memory_cap_bytes),
            EmbeddingStorageEstimator(topology, constraints),
        ],
    )


def torchrec_plan(
    job: JobSpec,
    memory_cap_bytes: float,
    compute_device: str = "cuda",
    model: Any = None,
    placement: RankPlacement | None = None,
    timeout_seconds: float | None = None,
) -> list[PlanEntry]:
    """TorchRec's planner's choice for the job, as our plan entries.

    The planner is given what it can use: world size, per-rank batch, each table's pooling
    factor, and the per-rank memory cap as its HBM; everything else is its own constants
    (it runs on CPU; `compute_device="cuda"` is the device class it costs for, the one its
    constants describe). With `model` (a `PerformanceModel`), shard costs come from our
    measurements instead (`measured_estimator`); storage is still TorchRec's estimate.
    `timeout_seconds`: TorchRec's own bound on its proposal loop (it keeps the best plan
    proposed by then); None, its default, runs every proposal.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError

    placement = placement or RankPlacement.single_node(job.world_size)
    topology = _planner_topology(job.world_size, placement, memory_cap_bytes, compute_device)
    constraints = _table_constraints(job, model)
    # The cap already is the embeddings' share of a device (policies.planning), so nothing
    # more is reserved; debug=False skips the planner's printed stats table.
    enumerator = None
    if model is not None:
        enumerator = _measured_enumerator(job, model, topology, constraints, placement.scope(), memory_cap_bytes)
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=job.batch_size,
        constraints=constraints,
        enumerator=enumerator,
        storage_reservation=FixedPercentageStorageReservation(0.0),
        debug=False,
        timeout_seconds=max(1, math.ceil(timeout_seconds)) if timeout_seconds else None,
    )
    try:
        plan = planner.plan(embedding_bag_collection(job), [EmbeddingBagCollectionSharder()])
    except PlannerError as exc:
        # e.g. a table larger than any rank's memory: this candidate is infeasible, the others still compete
        raise NoFeasiblePlanError(planner_error_reason(exc)) from None
    return from_sharding_plan(job, plan)


def planner_error_reason(exc: Exception) -> str:
    """TorchRec's PlannerError in one line: its last planner error when it gives one (the
    rest of its text is generic advice), with the error type."""
    text = str(exc)
    last = text.split("Last planner error:", 1)[1] if "Last planner error:" in text else text
    line = " ".join(last.split()) or type(exc).__name__
    kind = getattr(getattr(exc, "error_type", None), "value", None)
    return "TorchRec's planner found no plan" + (f" ({kind})" if kind else "") + f": {line[:500]}"

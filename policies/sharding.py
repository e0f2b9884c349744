"""Sharding policy: price candidate plans with the predictor, keep the fastest.

Candidates: the six classic table-wise sharders; two TorchRec-style uniform plans (every table
row-wise, every table column-wise); with torchrec installed, TorchRec's own planner twice (on
its cost constants, and on our measured costs through `policies.torchrec_bridge`); and a local
search over per-table sharding types that starts from the best of those
(`policies.sharding_search`). Every candidate is checked against
the per-rank cap on embedding weights and, given the device's memory, against the predicted
peak of a training step; the decision keeps all of them, ranked, with predicted time, per-rank
embedding load and memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from policies.plan import Candidate, Decision
from policies.policy import Estimator, decide, decision_for, predicted, ranked
from policies.sharders import SHARDERS, NoFeasiblePlanError
from policies.sharding_search import local_search
from predictors.dlrm_estimator import CostBreakdown, estimate_iteration
from predictors.memory import dlrm_memories
from predictors.performance_model import PerformanceModel
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.table_shards import COLUMN_WISE, ROW_WISE, PlanEntry, shard_bytes, split_kinds, table_shards

SEARCH = "search"
TORCHREC, TORCHREC_MEASURED = "torchrec", "torchrec_measured"
# TorchRec's planner (1.8.0) takes time in proportion to tables x ranks: 10 s for 100 tables on
# 8 ranks, 389 s for 300 on 64, over 600 s for 1,000 on 64 (one core of the development VM; its
# issues report 20+ minutes near 1,000 tables). As candidates it runs twice, so past this many
# table-ranks it is left out (the decision lists why) and the local search has the time instead;
# within it, each run's proposals are bounded by half the search's seconds (TorchRec's own
# `timeout_seconds`: it keeps the best plan proposed by then).
TORCHREC_MAX_TABLE_RANKS = 1024


def uniform_plans(spec: JobSpec) -> dict[str, list[PlanEntry]]:
    """Every table split the same way, where every table can be."""
    W = spec.world_size
    if W < 2:
        return {}
    out: dict[str, list[PlanEntry]] = {}
    kinds = [split_kinds(t.num_embeddings, t.embedding_dim, W) for t in spec.tables]
    if all(ROW_WISE in k for k in kinds):
        out["all_row_wise"] = [{"type": ROW_WISE} for _ in spec.tables]
    if all(COLUMN_WISE in k for k in kinds):
        out["all_column_wise"] = [{"type": COLUMN_WISE, "ranks": list(range(W))} for _ in spec.tables]
    return out


class PlanPricer:
    """Memory checks and the simulated iteration time of one plan of a job."""

    def __init__(
        self,
        spec: JobSpec,
        model: PerformanceModel,
        memory_cap_bytes: float,
        device_memory_bytes: float | None = None,
        placement: RankPlacement | None = None,
    ):
        self.spec, self.model, self.placement = spec, model, placement
        self.memory_cap_bytes, self.device_memory_bytes = memory_cap_bytes, device_memory_bytes
        self.memo: dict[tuple, Any] = {}  # op prices: a search's plans share most ranks' ops

    def memory(self, plan: Sequence[PlanEntry]) -> tuple[dict, str | None]:
        """Per-rank weights and predicted peak, and why the plan does not fit (None if it does)."""
        W = self.spec.world_size
        weights = shard_bytes(table_shards(self.spec, plan), W)
        detail = {"rank_memory_bytes": weights, "peak_memory_bytes": [m.peak for m in dlrm_memories(self.spec, plan)]}
        if max(weights) > self.memory_cap_bytes:
            return detail, (
                f"rank memory {max(weights) / 2**30:.2f} GiB exceeds cap {self.memory_cap_bytes / 2**30:.2f} GiB"
            )
        if self.device_memory_bytes is not None and max(detail["peak_memory_bytes"]) > self.device_memory_bytes:
            return detail, (
                f"predicted peak {max(detail['peak_memory_bytes']) / 2**30:.2f} GiB on a rank exceeds "
                f"the device's {self.device_memory_bytes / 2**30:.2f} GiB"
            )
        return detail, None

    def estimate(self, plan: Sequence[PlanEntry]) -> tuple[CostBreakdown | None, str | None]:
        """The predicted step, or why there is none: a plan that needs a collective the
        bundle has no model for (say, a calibration without reduce-scatter) cannot be priced,
        and a zero in its place would make it look cheaper than it is."""
        try:
            return estimate_iteration(self.spec, plan, self.model, placement=self.placement, memo=self.memo), None
        except KeyError as exc:
            return None, f"cannot be priced: {exc.args[0]}"

    def seconds(self, plan: list[PlanEntry]) -> float | None:
        """The search's cost: predicted seconds, None when the plan does not fit or cannot be priced."""
        if self.memory(plan)[1] is not None:
            return None
        cost, _ = self.estimate(plan)
        return cost.iteration_s if cost is not None else None

    def __call__(self, name: str, plan: list[PlanEntry]) -> Candidate:
        """The plan as a priced candidate: the sharding policy's default estimator."""
        detail, reason = self.memory(plan)
        detail = {"table_to_rank": plan, **detail}
        cost = None
        if reason is None:
            cost, reason = self.estimate(plan)
        if cost is None:
            return Candidate(name, None, False, {**detail, "reason": reason})
        detail["breakdown"] = cost.to_dict()
        detail["rank_embedding_ms"] = [(f + b) * 1e3 for f, b in zip(cost.embedding_fwd_s, cost.embedding_bwd_s)]
        return Candidate(name, cost.iteration_s * 1e3, True, detail)


@dataclass
class ShardingPolicy:
    """Every sharder's plan, the uniform plans, TorchRec's planner's, and a local search from
    the best of them; the fastest feasible plan wins."""

    spec: JobSpec
    model: PerformanceModel
    memory_cap_bytes: float
    seed: int = 0
    search: bool = True
    search_seconds: float = 20.0
    torchrec: bool = True
    placement: RankPlacement | None = None
    # options that produced no plan at all, with the reason
    refused: list[Candidate] = field(default_factory=list, init=False)
    name: str = field(default="sharding", init=False)

    def options(self) -> Iterable[tuple[str, list[PlanEntry]]]:
        W = self.spec.world_size
        self.refused = []  # enumerated afresh: listing the options twice must not list a refusal twice
        plans: dict[str, list[PlanEntry]] = {}
        for name, sharder in SHARDERS.items():
            try:
                plans[name] = list(sharder(self.spec.tables, W, self.memory_cap_bytes, seed=self.seed))
            except NoFeasiblePlanError as exc:
                self.refused.append(Candidate(name, None, False, {"reason": str(exc)}))
        plans.update(uniform_plans(self.spec))
        if self.torchrec and W > 1 and len(self.spec.tables) * W > TORCHREC_MAX_TABLE_RANKS:
            reason = (
                f"TorchRec's planner left out: {len(self.spec.tables)} tables x {W} ranks exceeds "
                f"{TORCHREC_MAX_TABLE_RANKS} table-ranks, past which it would take most of the planning time"
            )
            self.refused.extend(
                Candidate(name, None, False, {"reason": reason}) for name in (TORCHREC, TORCHREC_MEASURED)
            )
        elif self.torchrec and W > 1:
            refused: dict[str, str] = {}
            plans.update(
                torchrec_plans(
                    self.spec, self.model, self.memory_cap_bytes, self.placement, refused, self.search_seconds / 2
                )
            )
            self.refused.extend(Candidate(name, None, False, {"reason": reason}) for name, reason in refused.items())
        return plans.items()

    def choose(self, priced: list[Candidate], estimate: Estimator[list[PlanEntry]]) -> Decision:
        seen: dict[str, str] = {}
        candidates = self.refused + [_dedup(c, seen) for c in priced]
        feasible = [c for c in candidates if c.feasible]
        if self.search and feasible and self.spec.world_size > 1:
            candidates.append(self._searched(min(feasible, key=predicted), estimate, seen))
        order = ranked(candidates)
        if not order[0].feasible:
            raise NoFeasiblePlanError(
                f"no candidate places the {len(self.spec.tables)} tables on {self.spec.world_size} ranks within "
                f"{self.memory_cap_bytes / 2**30:.2f} GiB per rank:\n  "
                + "\n  ".join(f"{c.name}: {c.detail.get('reason')}" for c in candidates)
            )
        best = order[0]
        return decision_for(self.name, best, order, {"table_to_rank": best.detail["table_to_rank"]})

    def _searched(self, start: Candidate, estimate: Estimator[list[PlanEntry]], seen: dict[str, str]) -> Candidate:
        """The local search's plan from `start`, priced; costs from the estimator's `seconds`
        where it offers one (cheaper than a whole candidate), else from its candidates."""

        def seconds(plan: list[PlanEntry]) -> float | None:
            candidate = estimate(SEARCH, plan)
            return candidate.predicted_ms / 1e3 if candidate.feasible and candidate.predicted_ms is not None else None

        result = local_search(
            self.spec,
            start.detail["table_to_rank"],
            getattr(estimate, "seconds", seconds),
            seed=self.seed,
            max_seconds=self.search_seconds,
        )
        found = _dedup(estimate(SEARCH, result.plan), seen)
        found.detail["search"] = {**result.to_dict(), "started_from": start.name}
        found.detail["search"].pop("plan")
        return found


def choose_sharding(
    spec: JobSpec,
    model: PerformanceModel,
    memory_cap_bytes: float,
    seed: int = 0,
    device_memory_bytes: float | None = None,
    search: bool = True,
    search_seconds: float = 20.0,
    torchrec: bool = True,
    placement: RankPlacement | None = None,
    estimate: Estimator[list[PlanEntry]] | None = None,
) -> Decision:
    """Rank every candidate plan by predicted iteration time (infeasible ones last, with the
    reason). Raises `NoFeasiblePlanError` naming every candidate's reason when none fits.
    `torchrec=False` leaves TorchRec's planner out (it is skipped anyway when not installed).
    `placement`: the node of every rank (default: one node), so collectives are priced on the
    curves of their scope. `estimate`: another estimator than the simulator's `PlanPricer`."""
    policy = ShardingPolicy(spec, model, memory_cap_bytes, seed, search, search_seconds, torchrec, placement)
    return decide(policy, estimate or PlanPricer(spec, model, memory_cap_bytes, device_memory_bytes, placement))


def torchrec_plans(
    spec: JobSpec,
    model: PerformanceModel,
    memory_cap_bytes: float,
    placement: RankPlacement | None = None,
    refused: dict[str, str] | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, list[PlanEntry]]:
    """TorchRec's planner's plans (its constants; our measured costs), or none without torchrec.
    A planner that finds no plan (TorchRec's PlannerError, e.g. a table too large for any rank)
    is left out, its reason put in `refused` when given. `timeout_seconds` bounds each run's
    proposals (TorchRec's own option)."""
    out: dict[str, list[PlanEntry]] = {}
    try:
        from policies.torchrec_bridge import torchrec_plan

        estimators: tuple[tuple[str, dict[str, Any]], ...] = ((TORCHREC, {}), (TORCHREC_MEASURED, {"model": model}))
        for name, kwargs in estimators:
            try:
                out[name] = torchrec_plan(
                    spec, memory_cap_bytes, placement=placement, timeout_seconds=timeout_seconds, **kwargs
                )
            except NoFeasiblePlanError as exc:
                if refused is not None:
                    refused[name] = str(exc)
    except ImportError:
        return {}
    return out


def _dedup(candidate: Candidate, seen: dict[str, str]) -> Candidate:
    """Note when a candidate's plan equals an earlier one's (kept, so the table stays complete)."""
    if candidate.feasible:
        key = repr(candidate.detail["table_to_rank"])
        if key in seen:
            candidate.detail["same_placement_as"] = seen[key]
        seen.setdefault(key, candidate.name)
    return candidate

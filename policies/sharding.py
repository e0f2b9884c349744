"""Sharding policy: cost every sharder's placement with the predictor, keep the fastest."""
from __future__ import annotations

from policies.dlrm_cost import estimate_iteration
from policies.plan import Candidate, Decision
from policies.sharders import SHARDERS, NoFeasiblePlanError, rank_memory
from predictors.memory import dlrm_memory
from predictors.performance_model import PerformanceModel
from probes.jobspec import JobSpec


def choose_sharding(spec: JobSpec, model: PerformanceModel, memory_cap_bytes: float, seed: int = 0,
                    device_memory_bytes: float | None = None) -> Decision:
    """Rank the six sharders by predicted iteration time under a per-rank cap on embedding
    weights; with `device_memory_bytes`, a placement whose predicted peak (weights,
    gradients, optimizer state, buffers, activations) exceeds a device is infeasible too."""
    W = spec.world_size
    candidates: list[Candidate] = []
    errors: list[str] = []
    seen: dict[tuple[int, ...], str] = {}
    for name, sharder in SHARDERS.items():
        try:
            placement = sharder(spec.tables, W, memory_cap_bytes, seed=seed)
        except NoFeasiblePlanError as exc:
            errors.append(f"{name}: {exc}")
            candidates.append(Candidate(name, None, False, {"reason": str(exc)}))
            continue
        memory = rank_memory(spec.tables, placement, W)
        detail = {"table_to_rank": placement, "rank_memory_bytes": memory,
                  "peak_memory_bytes": [dlrm_memory(spec, placement, r).peak for r in range(W)]}
        reason = None
        if max(memory) > memory_cap_bytes:
            reason = f"rank memory {max(memory) / 2**30:.2f} GiB exceeds cap {memory_cap_bytes / 2**30:.2f} GiB"
        elif device_memory_bytes is not None and max(detail["peak_memory_bytes"]) > device_memory_bytes:
            reason = (f"predicted peak {max(detail['peak_memory_bytes']) / 2**30:.2f} GiB on a rank exceeds the "
                      f"device's {device_memory_bytes / 2**30:.2f} GiB")
        if reason is not None:
            errors.append(f"{name}: {reason}")
            candidates.append(Candidate(name, None, False, {**detail, "reason": reason}))
            continue
        key = tuple(placement)
        if key in seen:
            detail["same_placement_as"] = seen[key]
        seen.setdefault(key, name)
        cost = estimate_iteration(spec, placement, model)
        detail["breakdown"] = cost.to_dict()
        candidates.append(Candidate(name, cost.iteration_s * 1e3, True, detail))

    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        raise NoFeasiblePlanError(
            f"no sharder places the {len(spec.tables)} tables on {W} ranks within "
            f"{memory_cap_bytes / 2**30:.2f} GiB per rank:\n  " + "\n  ".join(errors)
        )
    # Ties (identical placements) go to the earlier sharder, so the choice is deterministic.
    order = list(SHARDERS)
    feasible.sort(key=lambda c: (round(c.predicted_ms, 9), order.index(c.name)))
    ranked = feasible + [c for c in candidates if not c.feasible]
    best = ranked[0]
    return Decision("sharding", best.name, best.predicted_ms, ranked, {"table_to_rank": best.detail["table_to_rank"]})

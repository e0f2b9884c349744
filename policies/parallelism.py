"""The parallelism policy: the layout a transformer job trains under.

Options: every layout that divides the job (`enumerate_layouts`): tensor parallel over a
divisor of the heads, pipeline stages over at most the blocks, data parallel over the rest
(dividing the global batch), micro-batch counts that divide each replica's batch (at least one
per stage under a pipeline), activation
recomputation off or on, and for plain data parallel DDP or FSDP (shard_grad_op, full_shard).
Each is priced by `LayoutPricer`: its peak memory per rank first (predictors/memory.py; a
layout over the cap is refused with the bytes it needs), then the critical-path simulation of
its iteration (predictors/transformer_estimator.py: the 1F1B schedule with its bubbles, TP
collectives on the critical path, DP buckets overlapped and sharing the link). A layout with
recomputation is priced only when the same layout without it does not fit: recomputing runs
every block's forward twice and saves only memory, so it is listed, unpriced, with that reason.
The fastest feasible layout is chosen; every candidate stays in the decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

from policies.plan import Candidate, Decision
from policies.policy import decide, decision_for, ranked
from policies.sharders import NoFeasiblePlanError
from predictors.performance_model import PerformanceModel
from predictors.transformer_estimator import estimate_transformer_iteration
from predictors.transformer_memory import transformer_memory
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.transformer_job import TransformerJob
from probes.vocabulary.transformer_spec import FSDP_MODES, TransformerSpec

GIB = 2**30
# Micro-batch counts tried: the powers of two dividing a replica's batch, up to this many.
MAX_MICRO_BATCHES = 64
UNPRICED_RECOMPUTE = "not priced: the same layout without recomputation fits, and recomputing only adds work"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_batch_options(local_batch: int) -> list[int]:
    """Powers of two that divide a replica's batch, from 1 up to MAX_MICRO_BATCHES."""
    out, m = [], 1
    while m <= min(local_batch, MAX_MICRO_BATCHES):
        if local_batch % m == 0:
            out.append(m)
        m *= 2
    return out


def enumerate_layouts(job: TransformerJob, skipped: dict[str, str] | None = None) -> Iterator[TransformerSpec]:
    """Every layout of `job` (see the module docstring). A (TP, PP) grid whose data-parallel
    degree does not divide the global batch is left out, its reason put in `skipped`."""
    world = job.world_size
    for tp in (t for t in divisors(world) if job.heads % t == 0):
        for pp in (p for p in divisors(world // tp) if p <= job.layers):
            dp = world // (tp * pp)
            if job.global_batch % dp:
                if skipped is not None:
                    skipped[f"dp{dp}-tp{tp}-pp{pp}"] = (
                        f"global_batch={job.global_batch} does not split over {dp} data-parallel replicas"
                    )
                continue
            sharding = FSDP_MODES if tp == 1 and pp == 1 and dp > 1 else ("none",)
            for micro in (m for m in micro_batch_options(job.global_batch // dp) if pp == 1 or m >= pp):
                for fsdp in sharding:
                    for recompute in (False, True):
                        yield job.spec(tp, pp, micro, recompute, fsdp)


@dataclass
class LayoutPricer:
    """Prices a layout: refused over the memory cap (with its peak), else its predicted
    iteration time; a layout the bundle cannot price fully (no model for one of its ops) is
    refused with the ops named, since its time would be a lower bound."""

    model: PerformanceModel
    memory_cap_bytes: float
    placement: RankPlacement | None = None
    fits: dict[str, bool] = field(default_factory=dict)  # layout name -> fits, for the recompute rule
    memo: dict[tuple, Any] = field(default_factory=dict)  # op prices, shared by the layouts priced

    def __call__(self, name: str, spec: TransformerSpec) -> Candidate:
        memory = transformer_memory(spec)
        detail: dict[str, Any] = {"layout": spec.to_dict(), "memory": memory.to_dict()}
        self.fits[name] = memory.fits(self.memory_cap_bytes)
        if not self.fits[name]:
            detail["reason"] = (
                f"needs {memory.peak / GIB:.2f} GiB per rank, over the cap of {self.memory_cap_bytes / GIB:.2f} GiB"
            )
            return Candidate(name, None, False, detail)
        if spec.recompute and self.fits.get(replace(spec, recompute=False).layout, False):
            detail["reason"] = UNPRICED_RECOMPUTE
            return Candidate(name, None, False, detail)
        estimate = estimate_transformer_iteration(spec, self.model, placement=self.placement, memo=self.memo)
        unpriced = [p for p in estimate.problems if p.startswith("no model for")]
        if unpriced:
            detail["reason"] = "cannot price: " + "; ".join(unpriced)
            return Candidate(name, None, False, detail)
        detail["breakdown"] = {
            "kernels_ms": estimate.simulation.iteration_s * 1e3,
            "overhead_ms": estimate.overhead_s * 1e3,
            "kernel_sum_ms": estimate.kernel_sum_s * 1e3,
            "exposed_comm_ms": max(r.exposed_comm_s for r in estimate.simulation.ranks) * 1e3,
            "out_of_range": estimate.problems,
        }
        return Candidate(name, estimate.iteration_s * 1e3, True, detail)


@dataclass
class ParallelismPolicy:
    job: TransformerJob
    name: str = "parallelism"
    skipped: dict[str, str] = field(default_factory=dict)

    def options(self) -> Iterable[tuple[str, TransformerSpec]]:
        return [(spec.layout, spec) for spec in enumerate_layouts(self.job, self.skipped)]

    def choose(self, priced: list[Candidate], estimate) -> Decision:
        candidates = ranked(priced)
        if not candidates or not candidates[0].feasible:
            reasons = "; ".join(f"{c.name}: {c.detail.get('reason')}" for c in candidates[:8])
            raise NoFeasiblePlanError(
                f"no layout of {self.job.name} fits or can be priced ({len(candidates)} tried): {reasons}"
                + (f"; left out: {self.skipped}" if self.skipped else ""),
                field="memory_cap_gb",
            )
        chosen = candidates[0]
        plain = next((c for c in candidates if c.name == _plain_data_parallel(self.job)), None)
        detail = {
            "layout": chosen.detail["layout"],
            "memory": chosen.detail["memory"],
            "plain_data_parallel_ms": plain.predicted_ms if plain is not None else None,
            "priced": sum(c.feasible for c in candidates),
            "left_out": self.skipped,
        }
        return decision_for(self.name, chosen, candidates, detail)


def _plain_data_parallel(job: TransformerJob) -> str:
    return job.spec().layout if job.global_batch % job.world_size == 0 else ""


def choose_parallelism(
    job: TransformerJob, model: PerformanceModel, memory_cap_bytes: float, placement: RankPlacement | None = None
) -> Decision:
    """The fastest layout of `job` that fits `memory_cap_bytes` per rank, beside every other
    (`NoFeasiblePlanError` naming each one's reason when none does)."""
    return decide(ParallelismPolicy(job), LayoutPricer(model, memory_cap_bytes, placement))


# The most GEMM shapes a calibration measures for one transformer job's layouts.
MAX_JOB_GEMMS = 120


def layout_gemms(job: TransformerJob) -> list[dict]:
    """The matrix products the job's layouts would be priced at (rank 0 of each layout's graph,
    without recomputation, which repeats them), largest first, spread over at most
    MAX_JOB_GEMMS: what a calibration for this job measures besides its sweep."""
    from predictors.transformer_graph import build_transformer_graph

    seen: dict[tuple, dict] = {}
    for spec in enumerate_layouts(job):
        if spec.recompute or spec.fsdp != "none":
            continue
        for op in build_transformer_graph(spec, fold=True).ranks[0]:
            if op.op == "gemm":
                key = tuple(op.params[k] for k in ("M", "N", "K", "dtype", "variant", "batch"))
                seen.setdefault(key, {k: op.params[k] for k in ("M", "N", "K", "dtype", "variant", "batch")})
    shapes = sorted(seen.values(), key=lambda p: -p["batch"] * p["M"] * p["N"] * p["K"])
    if len(shapes) <= MAX_JOB_GEMMS:
        return shapes
    step = len(shapes) / MAX_JOB_GEMMS
    return [shapes[int(i * step)] for i in range(MAX_JOB_GEMMS)]

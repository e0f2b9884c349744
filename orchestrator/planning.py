"""Choosing a plan for a job on a hardware with its registered models (no launch)."""
from __future__ import annotations

from orchestrator.cluster import HardwareFingerprint
from policies.dlrm_cost import estimate_iteration
from policies.plan import Plan
from policies.sharding import choose_sharding
from predictors.performance_model import PerformanceModel
from probes.jobspec import JobSpec

# Embedding weights may use this share of a device's memory when the job sets no cap: the
# rest holds activations, communication buffers and the framework.
DEFAULT_MEMORY_SHARE = 0.6


def memory_cap_bytes(job: JobSpec, fingerprint: HardwareFingerprint) -> float:
    if job.memory_cap_gb is not None:
        return job.memory_cap_gb * 2**30
    return DEFAULT_MEMORY_SHARE * fingerprint.min_device_memory_bytes


def make_plan(job: JobSpec, model: PerformanceModel, fingerprint: HardwareFingerprint, model_version: str | None) -> Plan:
    sharding = choose_sharding(job, model, memory_cap_bytes(job, fingerprint), seed=job.seed,
                               device_memory_bytes=fingerprint.min_device_memory_bytes)
    notes = [
        "iteration cost = critical-path simulation of the job's execution graph (per-op models, in-step "
        "corrections, waits at every collective) + the fitted per-step overhead",
    ]
    best = sharding.candidates[0]
    out_of_range = best.detail.get("breakdown", {}).get("out_of_range", [])
    if out_of_range:
        notes.append("extrapolating beyond measurements: " + "; ".join(out_of_range[:5]))
    return Plan(
        job=job.to_dict(),
        hardware_id=fingerprint.hardware_id,
        model_version=model_version,
        predicted_iteration_ms=sharding.predicted_ms,
        decisions={"sharding": sharding},
        notes=notes,
    )


def predict_plan_ms(job: JobSpec, plan: Plan, model: PerformanceModel) -> float:
    return estimate_iteration(job, plan.table_to_rank, model).iteration_s * 1e3

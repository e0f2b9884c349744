"""The autotune flow: recalibrate this cluster's models if they are missing, stale or drifting,
plan the job with the champion, launch it and compare (the command is
`python -m orchestrator.autotune`, see orchestrator/cli/autotune.py).

Everything lands in one MLflow run (experiment "autotune"): the calibration when one happens
(measurement table, held-out errors, registered model), the plan, the predicted and measured
iteration times and their relative error.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow

from orchestrator import calibrate as calibration
from orchestrator import registry
from orchestrator.cluster import HardwareFingerprint
from orchestrator.defaults import DEFAULT_MODEL_AGE_DAYS
from orchestrator.home import home_path
from orchestrator.jobfile import Job, ModelJob
from orchestrator.progress import detail, say
from policies.plan import Plan
from policies.planning import make_plan, make_transformer_plan
from predictors.performance_model import PerformanceModel
from probes.vocabulary.sweep_job import SweepJob
from probes.vocabulary.transformer_job import TransformerJob
from probes.vocabulary.transformer_spec import TransformerSpec

if TYPE_CHECKING:
    from orchestrator.launch import LaunchResult


def job_hash(job_dict: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(job_dict, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class AutotuneSettings:
    """recalibrate: auto (only when the champion is missing, stale or drifting), always or never;
    lock_timeout_s: how long to wait for another calibration of this hardware (None: 3 x the
    budget + 300 s); plan_out: where the plan JSON goes (None: $AUTOTUNE_HOME/plans/<job>-<hardware>.json);
    iterations: timed iterations when launching (None: the job's)."""

    recalibrate: str = "auto"
    max_model_age_days: float = DEFAULT_MODEL_AGE_DAYS
    calibration_budget_s: float = calibration.DEFAULT_BUDGET_S
    lock_timeout_s: float | None = None
    plan_out: str | None = None
    dry_run: bool = False
    iterations: int | None = None


def autotune(
    job: Job, fp: HardwareFingerprint, uri: str, settings: AutotuneSettings, started: float
) -> dict[str, Any] | None:
    """Run the flow inside one MLflow run; returns its summary, or None when there is no champion
    to plan with (said why). `started`: time.monotonic() when the command began (for wall_s)."""
    hw = fp.hardware_id
    summary: dict[str, Any] = {"hardware_id": hw, "job": job.name, "tracking_uri": uri}

    with mlflow.start_run(run_name=f"autotune-{job.name}") as run:
        summary["run_id"] = run.info.run_id
        mlflow.set_tags(
            {"kind": "autotune", "hardware_id": hw, "job_name": job.name, "job_hash": job_hash(job.to_dict())}
        )
        mlflow.log_dict(job.to_dict(), "job.json")
        mlflow.log_params(job_params(job.to_dict()))  # searchable and comparable in the UI

        champion = registry.get_alias(hw, registry.CHAMPION)
        freshness = registry.check_freshness(champion, fp.software, settings.max_model_age_days)
        needed = settings.recalibrate == "always" or (settings.recalibrate == "auto" and not freshness.fresh)
        if needed:
            # One calibration of a hardware at a time, across pods: the others wait for it and
            # then reuse what it promoted, unless it is still not fresh for them.
            with calibration.promotion_lease(hw).hold(
                settings.lock_timeout_s or calibration.lock_timeout_s(settings.calibration_budget_s),
                on_wait=calibration.waiting,
            ) as lease:
                if settings.recalibrate == "auto":
                    champion = registry.get_alias(hw, registry.CHAMPION)
                    freshness = registry.check_freshness(champion, fp.software, settings.max_model_age_days)
                    needed = not freshness.fresh
                if needed:
                    why = (
                        "forced by --recalibrate always"
                        if settings.recalibrate == "always"
                        else "; ".join(freshness.reasons)
                    )
                    say(f"recalibrating: {why}")
                    mlflow.set_tag("recalibration_reason", why)
                    with calibration.calibration_run(hw) as calibrating:
                        info = calibration.describe(
                            calibration.calibrate(
                                fp,
                                calibration.CalibrationRequest(
                                    settings.calibration_budget_s, None if isinstance(job, SweepJob) else job, job.seed
                                ),
                                lease,
                            )
                        )
                    info["run_id"] = calibrating.info.run_id
                    calibration.print_summary(info)
                    summary["calibration"] = info
                    champion = registry.get_alias(hw, registry.CHAMPION)
                else:
                    say(f"another process calibrated {hw} meanwhile: reusing champion v{champion.version}")
            if champion is None:
                say(
                    f"no champion for {hw}: the calibration's bundle was not promoted "
                    f"({summary.get('calibration', {}).get('promotion_reason', 'see above')})"
                )
                return None
        elif champion is None:
            say(f"no champion model for {hw} and --recalibrate never: nothing to plan with")
            return None
        else:
            state = "fresh" if freshness.fresh else "stale (" + "; ".join(freshness.reasons) + ")"
            say(f"reusing champion {champion.name} v{champion.version}: {state}; no recalibration")
        summary["recalibrated"] = needed
        summary["model"] = f"{champion.name}/{champion.version}"
        mlflow.set_tags({"model_name": champion.name, "model_version": champion.version})

        if isinstance(job, SweepJob):  # fused trials through Ray Tune, the width from the bundle
            from orchestrator.sweep import run_fusion_sweep

            if settings.dry_run:
                say("--dry-run: the sweep is not run")
            else:
                summary.update(run_fusion_sweep(job, champion.model, fp))
            summary["wall_s"] = round(time.monotonic() - started, 1)
            mlflow.log_metric("autotune_wall_s", summary["wall_s"])
            return summary

        plan = plan_job(job, champion.model, fp, champion.version)
        plan_path = Path(settings.plan_out or home_path("plans", f"{job.name}-{hw}.json"))
        plan.save(plan_path)
        mlflow.log_dict(plan.to_dict(), "plan.json")
        mlflow.log_table(candidate_table(plan), "plan_candidates.json")
        mlflow.log_metric("predicted_iteration_ms", plan.predicted_iteration_ms)
        mlflow.set_tags(
            {
                "placement_scope": plan.placement.get("scope", ""),
                "placement_ranks_per_node": json.dumps(plan.placement.get("ranks_per_node", {})),
                "node_types_priced": ",".join(plan.placement.get("node_types", [])),
            }
        )
        choice = report_plan(job, plan)
        detail(f"plan written to {plan_path}")
        summary.update({"plan": str(plan_path), "predicted_iteration_ms": plan.predicted_iteration_ms, **choice})

        if not settings.dry_run:
            iterations = settings.iterations or job.iterations
            say(f"launching {job.name} on {job.world_size} worker(s) for {iterations} timed iterations")
            result = launch_plan(job, plan, iterations, use_gpu=fp.device_kind == "cuda")
            error = abs(plan.predicted_iteration_ms - result.iteration_ms) / result.iteration_ms
            mlflow.log_metrics(
                {
                    "measured_iteration_ms": result.iteration_ms,
                    "prediction_error": error,
                    "loss_first": result.loss_first,
                    "loss_last": result.loss_last,
                    # other processes' load on rank 0's host while the steps were timed: the
                    # measured time's noise the prediction cannot see (absent: no rank 0 report)
                    **({} if result.host_other_share is None else {"host_other_share": result.host_other_share}),
                }
            )
            mlflow.log_dict(result.to_dict(), "launch.json")
            ran = {
                "planned": plan.placement,
                "rank_nodes": result.rank_nodes,
                "as_planned": result.placement_as_planned,
                "rank_cores": result.rank_cores,  # each rank's share of its host's cores (`core_binding`)
            }
            mlflow.log_dict(ran, "placement.json")
            mlflow.set_tag("placement_as_planned", str(result.placement_as_planned))
            say(
                f"ran {iterations} iterations; ranks ran {'as planned' if result.placement_as_planned else 'NOT as planned'} "
                f"on {len(set(result.rank_nodes or []))} node(s)"
            )
            summary.update(
                {
                    "measured_iteration_ms": result.iteration_ms,
                    "prediction_error": error,
                    "host_other_share": result.host_other_share,
                    "placement": ran,
                }
            )
        summary["wall_s"] = round(time.monotonic() - started, 1)
        mlflow.log_metric("autotune_wall_s", summary["wall_s"])
    return summary


def job_params(job: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A job's fields as MLflow params: scalars as they are, nested sections dotted
    (`dense.bottom_mlp`), lists of numbers joined, lists of records (tables) counted."""
    out: dict[str, Any] = {}
    for key, value in job.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(job_params(value, f"{name}."))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out[name] = len(value)
        elif isinstance(value, list):
            out[name] = ",".join(str(v) for v in value)[:500]
        else:
            out[name] = value
    return out


def candidate_table(plan: Plan) -> dict[str, list[Any]]:
    """Every candidate of every decision the plan made, one row each, for the run's table view."""
    rows = [
        (name, c.name, c.feasible, c.predicted_ms, c.name == d.choice, str(c.detail.get("reason", "")))
        for name, d in plan.decisions.items()
        for c in d.candidates
    ]
    columns = ("decision", "candidate", "feasible", "predicted_ms", "chosen", "reason")
    return {column: [row[i] for row in rows] for i, column in enumerate(columns)}


def plan_job(job: ModelJob, model: PerformanceModel, fp: HardwareFingerprint, version: str | None) -> Plan:
    if isinstance(job, TransformerJob):
        return make_transformer_plan(job, model, fp, version)
    return make_plan(job, model, fp, version)


def report_plan(job: ModelJob, plan: Plan) -> dict[str, Any]:
    """Say what the plan chose (tagged on the run too); returns it for the summary."""
    if isinstance(job, TransformerJob):
        decision = plan.decisions["parallelism"]
        key, tag = "layout", "parallelism_choice"
        shown = [c for c in decision.candidates if c.feasible]
    else:
        decision = plan.decisions["sharding"]
        key, tag = "sharding", "sharding_choice"
        shown = [c for c in decision.candidates if c.feasible]
    mlflow.set_tag(tag, decision.choice)
    say(
        f"plan: {key} {decision.choice}, predicted {plan.predicted_iteration_ms:.2f} ms/iteration; "
        f"next: "
        + ", ".join(f"{c.name}={c.predicted_ms:.2f}" for c in shown[1:4])
        + (f" (+{len(shown) - 4} more in plan_candidates.json)" if len(shown) > 4 else "")
    )
    detail("candidates: " + ", ".join(f"{c.name}={c.predicted_ms:.2f}" for c in shown))
    if plan.substitutions:
        say(f"substituting overlapped pairs: {plan.decisions['substitution'].choice}")
    say(
        f"placement: {job.world_size} rank(s) on {plan.rank_placement.node_count} node(s) of type "
        f"{', '.join(plan.placement.get('node_types', []))}, collectives priced {plan.placement.get('scope')}-node"
    )
    return {key: decision.choice}


def launch_plan(job: ModelJob, plan: Plan, iterations: int, use_gpu: bool) -> LaunchResult:
    """Run the job for real as planned (Ray Train), on the nodes the plan priced."""
    from orchestrator.launch import launch_dlrm, launch_transformer

    if isinstance(job, TransformerJob):
        return launch_transformer(
            TransformerSpec.from_dict(plan.layout),
            iterations,
            use_gpu=use_gpu,
            substitutions=plan.substitutions,
            placement=plan.placement,
            chunk_schedule=plan.chunk_schedule,
        )
    return launch_dlrm(
        job,
        plan.table_to_rank,
        iterations,
        use_gpu=use_gpu,
        chunk_schedule=plan.chunk_schedule,
        substitutions=plan.substitutions,
        placement=plan.placement,
    )

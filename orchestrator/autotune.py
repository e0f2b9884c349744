"""Autotune a job: fingerprint, recalibrate if needed, plan with the predictor, launch, compare.

    python -m orchestrator.autotune --job J [--dry-run] [--recalibrate auto|always|never]
        [--tracking-uri U] [--ray-address A] [--plan-out P] [--calibration-budget-s S] [--json]

Everything lands in one MLflow run (experiment "autotune"): the calibration when one happens
(measurement table, held-out errors, registered model), the plan, the predicted and measured
iteration times and their relative error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import mlflow

from orchestrator import registry
from orchestrator.calibrate import (
    DEFAULT_BUDGET_S, calibrate, describe, lock_timeout_s, print_summary, promotion_lease, waiting,
)
from orchestrator.cli_common import (
    EXIT_NO_MODEL, MAX_BUDGET_S, ArgumentParser, add_common, age_days, budget_s, fingerprint, int_in, number_in,
    output_file, run_main,
)
from orchestrator.jobfile import load_job
from orchestrator.planning import job_placement, make_plan
from orchestrator.progress import say
from probes.vocabulary.jobspec import MAX_ITERATIONS


def job_hash(job_dict: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(job_dict, sort_keys=True).encode()).hexdigest()[:12]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m orchestrator.autotune", description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="job YAML file (see examples/)")
    parser.add_argument("--dry-run", action="store_true", help="plan and log, but do not launch the job")
    parser.add_argument("--recalibrate", choices=("auto", "always", "never"), default="auto",
                        help="auto: only when models are missing, stale or drifting (default)")
    parser.add_argument("--plan-out", type=output_file,
                        help="write the plan JSON here (default .autotune/plans/<job>-<hardware>.json)")
    parser.add_argument("--calibration-budget-s", type=budget_s, default=DEFAULT_BUDGET_S)
    parser.add_argument("--max-model-age-days", type=age_days, default=7.0)
    parser.add_argument("--iterations", type=int_in(1, MAX_ITERATIONS), help="timed iterations when launching (default: the job's)")
    parser.add_argument("--lock-timeout-s", type=number_in(0.0, 4 * MAX_BUDGET_S, minimum_allowed=True, unit="seconds"),
                        default=None,
                        help="wait this long for another calibration of this hardware (default: 3 x the budget + 300 s)")
    add_common(parser)
    return parser.parse_args(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    job = load_job(args.job)
    uri = registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=True)
    job_placement(job, fp)  # a job larger than the cluster: refused (world_size named) before calibrating
    hw = fp.hardware_id
    say(f"hardware {hw}: {fp.summary()}; MLflow at {uri}")
    summary: dict[str, Any] = {"hardware_id": hw, "job": job.name, "tracking_uri": uri}

    with mlflow.start_run(run_name=f"autotune-{job.name}") as run:
        summary["run_id"] = run.info.run_id
        mlflow.set_tags({"kind": "autotune", "hardware_id": hw, "job_name": job.name, "job_hash": job_hash(job.to_dict())})
        mlflow.log_dict(job.to_dict(), "job.json")

        champion = registry.get_alias(hw, registry.CHAMPION)
        freshness = registry.check_freshness(champion, fp.software, args.max_model_age_days)
        needed = args.recalibrate == "always" or (args.recalibrate == "auto" and not freshness.fresh)
        if needed:
            # One calibration of a hardware at a time, across pods: the others wait for it and
            # then reuse what it promoted, unless it is still not fresh for them.
            with promotion_lease(hw).hold(args.lock_timeout_s or lock_timeout_s(args.calibration_budget_s),
                                          on_wait=waiting) as lease:
                if args.recalibrate == "auto":
                    champion = registry.get_alias(hw, registry.CHAMPION)
                    freshness = registry.check_freshness(champion, fp.software, args.max_model_age_days)
                    needed = not freshness.fresh
                if needed:
                    why = "forced by --recalibrate always" if args.recalibrate == "always" else "; ".join(freshness.reasons)
                    say(f"recalibrating: {why}")
                    mlflow.set_tag("recalibration_reason", why)
                    info = describe(calibrate(fp, args.calibration_budget_s, job, job.seed, lease=lease))
                    print_summary(info)
                    summary["calibration"] = info
                    champion = registry.get_alias(hw, registry.CHAMPION)
                else:
                    say(f"another process calibrated {hw} meanwhile: reusing champion v{champion.version}")
            if champion is None:
                say(f"no champion for {hw}: the calibration's bundle was not promoted "
                    f"({summary.get('calibration', {}).get('promotion_reason', 'see above')})")
                return EXIT_NO_MODEL
        elif champion is None:
            say(f"no champion model for {hw} and --recalibrate never: nothing to plan with")
            return EXIT_NO_MODEL
        else:
            state = "fresh" if freshness.fresh else "stale (" + "; ".join(freshness.reasons) + ")"
            say(f"reusing champion {champion.name} v{champion.version}: {state}; no recalibration")
        summary["recalibrated"] = needed
        summary["model"] = f"{champion.name}/{champion.version}"
        mlflow.set_tags({"model_name": champion.name, "model_version": champion.version})

        plan = make_plan(job, champion.model, fp, champion.version)
        plan_path = Path(args.plan_out or f".autotune/plans/{job.name}-{hw}.json")
        plan.save(plan_path)
        mlflow.log_dict(plan.to_dict(), "plan.json")
        mlflow.log_metric("predicted_iteration_ms", plan.predicted_iteration_ms)
        mlflow.set_tags({"placement_scope": plan.placement.get("scope", ""),
                         "placement_ranks_per_node": json.dumps(plan.placement.get("ranks_per_node", {})),
                         "node_types_priced": ",".join(plan.placement.get("node_types", []))})
        sharding = plan.decisions["sharding"]
        mlflow.set_tag("sharding_choice", sharding.choice)
        say(f"plan: sharder {sharding.choice}, predicted {plan.predicted_iteration_ms:.2f} ms/iteration; "
            f"candidates: " + ", ".join(f"{c.name}={c.predicted_ms:.2f}" for c in sharding.candidates if c.feasible))
        if plan.substitutions:
            say(f"substituting overlapped pairs: {plan.decisions['substitution'].choice}")
        say(f"placement: {job.world_size} rank(s) on {plan.rank_placement.node_count} node(s) of type "
            f"{', '.join(plan.placement.get('node_types', []))}, collectives priced {plan.placement.get('scope')}-node")
        say(f"plan written to {plan_path}")
        summary.update({"plan": str(plan_path), "sharding": sharding.choice, "predicted_iteration_ms": plan.predicted_iteration_ms})

        if not args.dry_run:
            from orchestrator.launch import launch_dlrm

            iterations = args.iterations or job.iterations
            say(f"launching {job.name} on {job.world_size} worker(s) for {iterations} timed iterations")
            result = launch_dlrm(job, plan.table_to_rank, iterations, use_gpu=fp.device_kind == "cuda",
                                 chunk_schedule=plan.chunk_schedule, substitutions=plan.substitutions,
                                 placement=plan.placement)
            error = abs(plan.predicted_iteration_ms - result.iteration_ms) / result.iteration_ms
            mlflow.log_metrics({
                "measured_iteration_ms": result.iteration_ms,
                "prediction_error": error,
                "loss_first": result.loss_first,
                "loss_last": result.loss_last,
            })
            mlflow.log_dict(result.to_dict(), "launch.json")
            ran = {"planned": plan.placement, "rank_nodes": result.rank_nodes,
                   "as_planned": result.placement_as_planned}
            mlflow.log_dict(ran, "placement.json")
            mlflow.set_tag("placement_as_planned", str(result.placement_as_planned))
            say(f"measured {result.iteration_ms:.2f} ms/iteration vs predicted {plan.predicted_iteration_ms:.2f} ms "
                f"(error {error:.1%}); ranks ran {'as planned' if result.placement_as_planned else 'NOT as planned'} "
                f"on {len(set(result.rank_nodes or []))} node(s)")
            summary.update({"measured_iteration_ms": result.iteration_ms, "prediction_error": error,
                            "placement": ran})
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        mlflow.log_metric("autotune_wall_s", summary["wall_s"])
    say(f"done in {summary['wall_s']}s; browse with: mlflow ui --backend-store-uri {uri}")
    if args.json:
        print(json.dumps(summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

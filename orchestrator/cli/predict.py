"""Predict a job's iteration time under a given plan with the registered champion.

python -m orchestrator.cli.predict --job J --plan P [--tracking-uri U] [--json]   → {"iteration_ms": ...}
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from orchestrator.cli.options import emit, entry_point, job_parser, parse
from orchestrator.progress import say

EXAMPLES = ("python -m orchestrator.cli.predict --job job.yaml --plan .autotune/plans/<job>-<hardware>.json --json",)


def _human(out: dict) -> None:
    say(f"predicted {out['iteration_ms']:.2f} ms/iteration with model v{out['model_version']}")


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser("orchestrator.cli.predict", __doc__, EXAMPLES)
    parser.add_argument("--plan", required=True, help="a plan JSON written by autotune or plan")
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    from orchestrator.jobfile import load_job
    from policies.plan import Plan

    job = load_job(args.job)
    plan = Plan.load(args.plan)
    plan.check_job(job)  # before anything starts: a plan of other tables or world size is refused
    from orchestrator import registry
    from orchestrator.cli.common import champion_or_exit, fingerprint
    from policies.planning import job_placement
    from predictors.dlrm_estimator import estimate_iteration
    from predictors.transformer_estimator import estimate_transformer_iteration
    from probes.vocabulary.transformer_job import TransformerJob
    from probes.vocabulary.transformer_spec import TransformerSpec

    registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=False)
    if plan.hardware_id != fp.hardware_id:
        say(f"note: the plan was made for {plan.hardware_id}; predicting for this hardware, {fp.hardware_id}")
    champion = champion_or_exit(fp.hardware_id)
    placement = plan.rank_placement if plan.placement else job_placement(job, fp)
    if isinstance(job, TransformerJob):
        layout = TransformerSpec.from_dict(plan.layout)
        estimate = estimate_transformer_iteration(layout, champion.model, placement=placement)
        iteration_s = estimate.iteration_s
        breakdown = {
            "layout": layout.layout,
            "overhead_ms": estimate.overhead_s * 1e3,
            "memory": estimate.memory.to_dict() if estimate.memory else None,
            "problems": estimate.problems,
        }
    else:
        cost = estimate_iteration(job, plan.table_to_rank, champion.model, placement=placement)
        iteration_s, breakdown = cost.iteration_s, cost.to_dict()
    out = {
        "iteration_ms": iteration_s * 1e3,
        "breakdown": breakdown,
        "hardware_id": fp.hardware_id,
        "model_version": champion.version,
    }
    emit(out, args.json, _human)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

"""Run a job for real with a given plan on the Ray cluster and report its iteration time.

python -m orchestrator.cli.run --job J --plan P --iters N [--ray-address A] [--json]
    → {"iteration_ms": ..., "iterations": N}
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from orchestrator.cli.options import emit, entry_point, int_in, job_parser, parse
from orchestrator.progress import say
from probes.vocabulary.jobspec import MAX_ITERATIONS

EXAMPLES = ("python -m orchestrator.cli.run --job job.yaml --plan plan.json --iters 50 --json",)


def _human(out: dict) -> None:
    say(f"measured {out['iteration_ms']:.2f} ms/iteration over {out['iterations']} iterations")


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser("orchestrator.cli.run", __doc__, EXAMPLES)
    parser.add_argument("--plan", required=True, help="a plan JSON written by autotune or plan")
    parser.add_argument("--iters", type=int_in(1, MAX_ITERATIONS), help="timed iterations (unset: the job's)")
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    from orchestrator.core_binding import binding_mode

    binding_mode()  # a bad AUTOTUNE_CORE_BINDING is refused (exit 2) before anything starts
    from orchestrator.jobfile import load_job
    from policies.plan import Plan

    job = load_job(args.job)
    plan = Plan.load(args.plan)
    plan.check_job(job)  # before anything starts: a plan of other tables or world size is refused
    from orchestrator.autotuning import launch_plan
    from orchestrator.cli.common import fingerprint
    from policies.planning import job_placement, placement_record

    fp = fingerprint(args.ray_address, start_ray=True)
    # The ranks go where the plan's placement says, on this cluster's nodes as they are now.
    placement = job_placement(job, fp)
    if plan.placement and plan.rank_placement != placement:
        say(
            f"note: the plan priced ranks per node {plan.placement.get('ranks_per_node')}; this cluster packs them "
            f"{placement.to_dict()['ranks_per_node']}"
        )
    plan.placement = placement_record(placement, fp)
    result = launch_plan(job, plan, args.iters or job.iterations, use_gpu=fp.device_kind == "cuda")
    out = result.to_dict()  # with how long the host took to go quiet, and where each rank ran
    emit(out, args.json, _human)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

"""Plan a job with the registered champion, without launching it.

python -m orchestrator.cli.plan --job J [--out P] [--tracking-uri U] [--ray-address A] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from orchestrator.cli.options import UsageError, emit, entry_point, job_parser, output_file, parse
from orchestrator.progress import say

EXAMPLES = (
    "python -m orchestrator.cli.plan --job examples/dlrm_small.yaml",
    "python -m orchestrator.cli.plan --job job.yaml --out plan.json --json",
)


def _human(plan: dict[str, Any]) -> None:
    if "parallelism" in plan["decisions"]:
        _human_layouts(plan)
        return
    decision = plan["decisions"]["sharding"]
    say(f"hardware {plan['hardware_id']}, model v{plan['model_version']}")
    for c in decision["candidates"]:
        mark = "*" if c["name"] == decision["choice"] else " "
        if c["feasible"]:
            mem = max(c["detail"]["rank_memory_bytes"]) / 2**20
            say(f" {mark} {c['name']:20s} {c['predicted_ms']:8.2f} ms   max rank memory {mem:8.1f} MiB")
        else:
            say(f"   {c['name']:20s} infeasible: {c['detail'].get('reason')}")
    search = next((c["detail"].get("search") for c in decision["candidates"] if c["name"] == "search"), None)
    if search:
        say(
            f"search from {search['started_from']}: {len(search['moves'])} move(s) kept of {search['evaluations']} "
            f"plans priced in {search['seconds']:.1f}s"
            + ("; " + "; ".join(search["moves"][:5]) if search["moves"] else "")
        )
    say(f"chosen: {decision['choice']} at {plan['predicted_iteration_ms']:.2f} ms/iteration")
    chunking = plan["decisions"].get("chunking")
    if chunking:
        d = chunking["choice_detail"]
        base = d.get("best_baseline", {})
        say(
            f"gradient all-reduce {d['collective_bytes'] / 2**20:.1f} MiB on {d['topology']['name']} "
            f"({' x '.join(str(x['peers']) for x in d['topology']['dims'])}): {d['chunks']} chunk(s), {d['schedule']}, "
            f"{chunking['predicted_ms']:.3f} ms, utilisation {d['utilization']:.0%}"
            + (
                f"; best baseline {base['name']} {base['predicted_ms']:.3f} ms ({base['speedup']:.2f}x slower)"
                if base
                else ""
            )
        )


def _human_layouts(plan: dict[str, Any]) -> None:
    """A transformer plan: every layout priced, with its peak memory; the refused ones' reasons."""
    decision = plan["decisions"]["parallelism"]
    say(f"hardware {plan['hardware_id']}, model v{plan['model_version']}")
    for c in decision["candidates"]:
        mark = "*" if c["name"] == decision["choice"] else " "
        peak = c["detail"]["memory"]["peak"] / 2**30
        if c["feasible"]:
            say(f" {mark} {c['name']:34s} {c['predicted_ms']:9.2f} ms   peak {peak:7.2f} GiB/rank")
        else:
            say(f"   {c['name']:34s} {'-':>9s}      peak {peak:7.2f} GiB/rank: {c['detail'].get('reason')}")
    plain = decision["choice_detail"].get("plain_data_parallel_ms")
    say(
        f"chosen: {decision['choice']} at {plan['predicted_iteration_ms']:.2f} ms/iteration"
        + (f" (plain data parallel: {plain:.2f} ms)" if plain else "")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = job_parser("orchestrator.cli.plan", __doc__, EXAMPLES)
    parser.add_argument("--out", type=output_file, help="also write the plan JSON to this file")
    parser.add_argument(
        "--torchrec-plan-out",
        type=output_file,
        help="also write the DLRM plan as a TorchRec sharding plan (JSON; "
        "policies.torchrec_plans.load_torchrec_plan turns it into the ShardingPlan DistributedModelParallel takes)",
    )
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    from orchestrator.jobfile import load_job

    job = load_job(args.job)
    if args.torchrec_plan_out and job.workload != "dlrm":
        raise UsageError(
            f"--torchrec-plan-out: a TorchRec sharding plan shards a DLRM's tables; this job's workload is {job.workload!r}",
            "--torchrec-plan-out",
        )
    from orchestrator import registry
    from orchestrator.autotuning import plan_job
    from orchestrator.cli.common import champion_or_exit, fingerprint

    registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=False)
    champion = champion_or_exit(fp.hardware_id)
    plan = plan_job(job, champion.model, fp, champion.version)
    if args.out:
        plan.save(args.out)
    if args.torchrec_plan_out:
        from policies.torchrec_plans import torchrec_plan_record
        from probes.vocabulary.files import atomic_write_text

        record = torchrec_plan_record(job, plan.table_to_rank, plan.rank_placement, fp.device_kind)
        atomic_write_text(args.torchrec_plan_out, json.dumps(record, indent=1))
        say(f"TorchRec sharding plan written to {args.torchrec_plan_out}")
    emit(plan.to_dict(), args.json, _human)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

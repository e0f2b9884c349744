"""Predict a job's iteration time with the registered champion: a job under a plan, or the job
recorded in your own per-rank torch.profiler traces.

python -m orchestrator.cli.predict --job J --plan P [--tracking-uri U] [--json]   → {"iteration_ms": ...}
python -m orchestrator.cli.predict --trace DIR [--step N] [--json]               → {"iteration_ms": ..., "trace_ms": ...}

With --trace, DIR holds one Kineto trace per rank of any model's training (exported by
torch.profiler with record_shapes=True: `prof.export_chrome_trace(f"trace_rank{rank}.json")`
or tensorboard_trace_handler), each step marked by `prof.step()`. The step is rebuilt as an
execution graph (predictors/kineto_trace.py); every GEMM, element-wise op and collective this
hardware's models cover is priced by them, the rest keeps its traced time; printed beside the
trace's own step time, with the share of the step that was priced.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from orchestrator.cli.options import add_common, bad_input, command_parser, emit, entry_point, int_in, parse, trace_dir
from orchestrator.progress import say

EXAMPLES = (
    "python -m orchestrator.cli.predict --job job.yaml --plan .autotune/plans/<job>-<hardware>.json --json",
    "python -m orchestrator.cli.predict --trace ./traces --json",
)


def _human(out: dict) -> None:
    say(f"predicted {out['iteration_ms']:.2f} ms/iteration with model v{out['model_version']}")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("orchestrator.cli.predict", __doc__, EXAMPLES)
    parser.add_argument("--job", help="job YAML file (with --plan; examples/dlrm_small.yaml shows every field)")
    parser.add_argument("--plan", help="a plan JSON written by autotune or plan (with --job)")
    parser.add_argument(
        "--trace", type=trace_dir, help="a directory of per-rank torch.profiler (Kineto) traces (instead of --job)"
    )
    parser.add_argument(
        "--step",
        type=int_in(0, 2**31 - 1),
        help="with --trace: the ProfilerStep#N to predict (unset: the last in every trace)",
    )
    add_common(parser)
    return parser


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    if args.trace and (args.job or args.plan):
        parser.error("argument --trace: not allowed with --job / --plan (a trace is the job)")
    if not args.trace and not (args.job and args.plan):
        parser.error("the following arguments are required: --job and --plan, or --trace")
    if args.step is not None and not args.trace:
        parser.error("argument --step: only with --trace")
    if args.trace:
        return _predict_trace(args)
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


def _human_trace(out: dict) -> None:
    say(
        f"step {out['step']} of {out['ranks']} rank(s) in {out['trace']}: traced {out['trace_ms']:.2f} ms, "
        f"rebuilt from the trace {out['rebuilt_ms']:.2f} ms, predicted {out['iteration_ms']:.2f} ms on "
        f"{out['hardware_id']} (model v{out['model_version']}); {out['priced_share']:.0%} of rank 0's traced op "
        "time priced by the models"
    )
    for name, ms in out["unpriced_ms"].items():
        say(f"  kept as traced: {name} {ms:.2f} ms")


def _predict_trace(args: argparse.Namespace) -> int:
    from orchestrator import registry
    from orchestrator.cli.common import champion_or_exit, fingerprint
    from predictors.kineto_trace import TraceError, common_steps, load_traces, predict_step, steps_for

    try:
        traces = load_traces(args.trace)
        numbers = common_steps(traces)
        if not numbers:
            raise TraceError(
                f"{args.trace}: no ProfilerStep#N common to every rank's trace (call prof.step() each step)"
            )
        if args.step is not None and args.step not in numbers:
            return bad_input(f"--step {args.step}: every trace holds steps {numbers}", "--step", args.json)
        step = numbers[-1] if args.step is None else args.step
        steps = steps_for(traces, step)
    except TraceError as exc:
        return bad_input(str(exc), "--trace", args.json)
    registry.configure(args.tracking_uri)
    fp = fingerprint(args.ray_address, start_ray=False)
    champion = champion_or_exit(fp.hardware_id)
    found = predict_step(steps, [t.host for t in traces], champion.model)
    top = sorted(found.priced.unpriced.items(), key=lambda kv: -kv[1])[:8]
    out = {
        "iteration_ms": found.predicted_s * 1e3,
        "trace_ms": found.traced_s * 1e3,
        "rebuilt_ms": found.rebuilt_s * 1e3,
        "priced_share": found.priced.priced_share,
        "unpriced_ms": {name: s * 1e3 for name, s in top},
        "step": step,
        "ranks": len(traces),
        "trace": str(args.trace),
        "hardware_id": fp.hardware_id,
        "model_version": champion.version,
    }
    emit(out, args.json, _human_trace)
    return 0


main = entry_point(_main)


if __name__ == "__main__":
    sys.exit(main())

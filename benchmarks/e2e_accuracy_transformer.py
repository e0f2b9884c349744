"""Whole-iteration accuracy of the critical-path simulator on small GPT-style block stacks
run for real over 2 ranks (data parallel, and tensor parallel for comparison).

    .venv/bin/python benchmarks/e2e_accuracy_transformer.py [--tasks 12] [--budget-s 300] [--tracking-uri URI] [--rounds 2]
        [--host-check CALIBRATION_DIR]

Tasks are drawn from `--seed` (default: a fresh one, printed and recorded); the signed error is
reported beside the absolute one. Calibrates this machine with the generic sweep into a scratch MLflow store (or uses the
champion under `--tracking-uri`), draws random block stacks (layers, hidden, heads, sequence
length, batch), runs each through the Ray Train launcher and predicts it with the simulator
over `predictors/transformer_graph.py`'s graph; the baseline is the plain sum of the slowest
rank's kernels. Each task is launched `--rounds` times (default 2) and measured as the median,
with the launches' disagreement (the host's noise floor) reported beside the errors. Writes
benchmarks/results/e2e_accuracy_transformer.json.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import (  # noqa: E402
    LaunchLog,
    add_host_check_arguments,
    add_rounds_argument,
    champion_on_ray,
    check_host_check_argument,
    error_summary,
    geomean,
    interval_text,
    make_checks,
    measure_in_rounds,
    own_calibration,
    print_host_speed,
    print_other_load,
    print_own_steps,
    repeat_spread,
    signed_error,
    signed_summary,
    spread,
    write_result,
)
from orchestrator import ray_runtime  # noqa: E402
from orchestrator.launch import launch_transformer  # noqa: E402
from predictors.transformer_estimator import estimate_transformer_iteration  # noqa: E402
from probes.vocabulary.transformer_spec import random_transformer  # noqa: E402


def data_parallel_tasks(n: int, world_size: int, seed: int) -> list:
    """The benchmark's data-parallel draw for `seed` (also `benchmarks/launch_vs_probe.py`'s)."""
    return [random_transformer(i, world_size, 1, seed) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12, help="data-parallel tasks")
    parser.add_argument("--tp-tasks", type=int, default=4, help="tensor-parallel tasks, reported apart")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=300)
    parser.add_argument("--tracking-uri")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="task seed (default: a fresh one, recorded)")
    add_rounds_argument(parser)
    add_host_check_arguments(parser)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/e2e_accuracy_transformer.json"))
    args = parser.parse_args()
    check_host_check_argument(parser, args)
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    print(f"tasks: {args.tasks} + {args.tp_tasks} drawn with --seed {args.seed}", flush=True)

    specs = data_parallel_tasks(args.tasks, args.world_size, args.seed)
    specs += [random_transformer(100 + i, args.world_size, args.world_size, args.seed) for i in range(args.tp_tasks)]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        fingerprint, model = champion_on_ray(scratch, args.tracking_uri, args.budget_s, args.seed)
        calibration = args.host_check or (None if args.tracking_uri else own_calibration(scratch))
        checks, own_steps, between = make_checks(calibration, args, "transformer", model, fingerprint.hardware_id)
        log = LaunchLog(len(specs))
        launched = measure_in_rounds(
            [spec.name for spec in specs],
            args.rounds,
            lambda i: log.timed(
                i, launch_transformer(specs[i], iterations=args.iterations, storage=scratch / "ray_results")
            ),
            between,
        )
        rows = []
        for spec, times, shares, ended in zip(specs, launched, log.other_shares, log.ended_unix):
            t0 = time.perf_counter()
            estimate = estimate_transformer_iteration(spec, model)
            predict_ms = (time.perf_counter() - t0) * 1e3
            measured = statistics.median(times)
            predicted, baseline = estimate.iteration_s * 1e3, estimate.kernel_sum_s * 1e3
            row = {
                "name": spec.name,
                "spec": spec.to_dict(),
                "tensor_parallel": spec.tensor_parallel,
                "measured_ms": measured,
                "measured_rounds_ms": times,
                "host_other_share_rounds": shares,
                "launch_ended_unix": ended,
                "predicted_ms": predicted,
                "error": abs(predicted - measured) / measured,
                "baseline_ms": baseline,
                "baseline_error": abs(baseline - measured) / measured,
                "exposed_comm_ms": max(t.exposed_comm_s for t in estimate.simulation.ranks) * 1e3,
                "predict_wall_ms": predict_ms,
                "problems": estimate.problems[:5],
                "predicted_peak_memory_mb": estimate.memory.peak / 2**20 if estimate.memory else None,
            }
            rows.append(row)
            print(
                f"{spec.name:10s} L={spec.layers} H={spec.hidden:3d} heads={spec.heads} S={spec.seq_len:3d} "
                f"B={spec.batch_size}  measured {measured:8.2f} ms  predicted {predicted:8.2f} ({row['error']:6.1%})  "
                f"kernel sum {baseline:8.2f} ({row['baseline_error']:6.1%})",
                flush=True,
            )
        ray_runtime.shutdown()

    dp = [r for r in rows if r["tensor_parallel"] == 1]
    tp = [r for r in rows if r["tensor_parallel"] > 1]
    result = {
        "hardware_id": fingerprint.hardware_id,
        "command": f"python benchmarks/e2e_accuracy_transformer.py --tasks {args.tasks} --tp-tasks {args.tp_tasks} "
        + ("--tracking-uri URI " if args.tracking_uri else f"--budget-s {args.budget_s:g} ")
        + f"--seed {args.seed} --rounds {args.rounds}"
        + (f" --host-check DIR --host-check-points {args.host_check_points}" if args.host_check else "")
        + (f" --step-checks {args.step_checks}" if args.host_check else ""),
        "task_seed": args.seed,
        "tasks": dp,
        **error_summary([r["error"] for r in dp]),
        **signed_summary(dp),
        "baseline_geomean_error": geomean([r["baseline_error"] for r in dp]),
        **repeat_spread([r["measured_rounds_ms"] for r in dp]),
        **log.result(),
        **checks.result(),
        **own_steps.result(),
        "tensor_parallel_tasks": tp,
        "tensor_parallel_geomean_error": geomean([r["error"] for r in tp]) if tp else None,
        "tensor_parallel_mean_signed_error": signed_error(tp) if tp else None,
        "tensor_parallel": spread([r["error"] for r in tp]) if tp else None,
        "tensor_parallel_baseline_geomean_error": geomean([r["baseline_error"] for r in tp]) if tp else None,
    }
    out = write_result(args.out, result)
    print(
        f"data parallel: geomean error {result['geomean_error']:.1%}{interval_text(result['geomean_interval'])} "
        f"(median {result['median_error']:.1%}, mean {result['mean_error']:.1%}, max {result['max_error']:.1%}, "
        f"mean signed {result['mean_signed_error']:+.1%}{interval_text(result['mean_signed_interval'], signed=True)}; "
        f"kernel-sum baseline {result['baseline_geomean_error']:.1%}) over {len(dp)} tasks (95% intervals)"
    )
    if tp:
        print(
            f"tensor parallel: geomean error {result['tensor_parallel_geomean_error']:.1%} (baseline "
            f"{result['tensor_parallel_baseline_geomean_error']:.1%}) over {len(tp)} tasks"
        )
    if result["repeat_spread_geomean"] is not None:
        print(
            f"host noise (data parallel): a task's {args.rounds} launches disagreed by "
            f"{result['repeat_spread_geomean']:.1%} (geomean over tasks), at most {result['repeat_spread_max']:.1%}"
        )
    print_host_speed(result)
    print_other_load(result)
    print_own_steps(result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

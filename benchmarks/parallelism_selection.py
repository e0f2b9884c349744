"""Does the parallelism policy choose the fastest layout? Random transformer jobs, every layout
that fits run for real against each other, the policy's choice against the measured fastest.

    .venv/bin/python benchmarks/parallelism_selection.py [--jobs 8] [--world-size 2] [--seed S]
        [--tracking-uri URI | --budget-s 300] [--rounds 3] [--steps 2]

Jobs are drawn from `--seed` (default: a fresh one, recorded). The champion comes from
`--tracking-uri`, or from a calibration of this machine into a scratch store. Per job the
policy prices every layout (policies/parallelism.py) and chooses; then every layout that fits
the memory cap, the recomputing ones the policy left unpriced included, runs on `--world-size`
gloo ranks (one thread each, as the launcher runs them) in interleaved, rotated rounds
(probes/workloads/layout_race.py), each layout's time drift-adjusted against the rounds. A job
counts as a success when the chosen layout's measured time is within 10% of the fastest
measured one. Also reported: plain data parallel's time, and the prediction error of every
layout, grouped by what the layout uses. Writes benchmarks/results/parallelism_selection.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import champion_on_ray, error_summary, write_result  # noqa: E402
from policies.parallelism import choose_parallelism  # noqa: E402
from policies.planning import TRANSFORMER_MEMORY_SHARE, memory_cap_bytes  # noqa: E402
from predictors.transformer_estimator import estimate_transformer_iteration  # noqa: E402
from probes.vocabulary.transformer_job import random_transformer_job  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402

SUCCESS_WITHIN = 0.10


def _race_rank(rank: int, world: int, specs: list[dict], rounds: int, steps: int, tmp: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    from probes.workloads.layout_race import race_layouts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    race = race_layouts([TransformerSpec.from_dict(s) for s in specs], rank, torch.device("cpu"), rounds, steps)
    if rank == 0:
        Path(f"{tmp}/race.json").write_text(json.dumps([float(t) for t in race.plan_seconds()]))
    dist.barrier()
    os._exit(0)  # skip gloo's teardown (its threads can abort an exiting process)


def race(specs: list[TransformerSpec], world: int, rounds: int, steps: int) -> list[float]:
    """Every layout's drift-adjusted step time (seconds), measured on `world` spawned ranks."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_race_rank, args=(world, [s.to_dict() for s in specs], rounds, steps, tmp), nprocs=world)
        return json.loads(Path(f"{tmp}/race.json").read_text())


def family(spec: TransformerSpec) -> str:
    """What a layout uses, for grouping the prediction errors."""
    parts = [f"tp{spec.tensor_parallel}" if spec.tensor_parallel > 1 else ""]
    parts.append(f"pp{spec.pipeline_parallel}" if spec.pipeline_parallel > 1 else "")
    parts.append(spec.fsdp if spec.fsdp != "none" else "")
    parts.append("micro-batches" if spec.micro_batches > 1 and spec.pipeline_parallel == 1 else "")
    parts.append("recompute" if spec.recompute else "")
    return "+".join(p for p in parts if p) or "data parallel"


def run_job(index: int, args: argparse.Namespace, fingerprint, model) -> dict:
    job = random_transformer_job(index, args.world_size, args.seed)
    cap = memory_cap_bytes(job, fingerprint, TRANSFORMER_MEMORY_SHARE)
    t0 = time.perf_counter()
    decision = choose_parallelism(job, model, cap)
    plan_s = time.perf_counter() - t0
    fits = [c for c in decision.candidates if c.detail["memory"]["peak"] <= cap]
    specs = [TransformerSpec.from_dict(c.detail["layout"]) for c in fits]
    print(f"{job.name}: {len(specs)} layouts fit; the policy chose {decision.choice} in {plan_s:.1f}s", flush=True)
    t0 = time.perf_counter()
    measured = race(specs, args.world_size, args.rounds, args.steps)
    layouts = []
    for spec, candidate, seconds in zip(specs, fits, measured):
        predicted = candidate.predicted_ms
        if predicted is None:  # a recomputing layout the policy left unpriced: priced here for the error
            predicted = estimate_transformer_iteration(spec, model).iteration_s * 1e3
        layouts.append(
            {"layout": spec.layout, "family": family(spec), "predicted_ms": predicted, "measured_ms": seconds * 1e3}
        )
    by_name = {row["layout"]: row for row in layouts}
    fastest = min(layouts, key=lambda row: row["measured_ms"])
    chosen = by_name[decision.choice]
    plain = by_name.get(job.spec().layout) if job.global_batch % job.world_size == 0 else None
    slower = chosen["measured_ms"] / fastest["measured_ms"] - 1
    print(
        f"  raced in {time.perf_counter() - t0:.0f}s: chosen {chosen['measured_ms']:.1f} ms, fastest "
        f"{fastest['layout']} {fastest['measured_ms']:.1f} ms ({slower:+.1%}), plain DP "
        f"{plain['measured_ms'] if plain else float('nan'):.1f} ms",
        flush=True,
    )
    return {
        "job": job.to_dict(),
        "chosen": decision.choice,
        "chosen_ms": chosen["measured_ms"],
        "fastest": fastest["layout"],
        "fastest_ms": fastest["measured_ms"],
        "plain_data_parallel_ms": plain["measured_ms"] if plain else None,
        "chosen_slower_than_fastest": slower,
        "success": slower <= SUCCESS_WITHIN,
        "plan_seconds": plan_s,
        "layouts": layouts,
    }


def summarize(jobs: list[dict]) -> dict:
    errors: dict[str, list[float]] = {}
    for job in jobs:
        for row in job["layouts"]:
            error = abs(row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"]
            errors.setdefault(row["family"], []).append(error)
            errors.setdefault("all", []).append(error)
    return {
        "success_rate": sum(j["success"] for j in jobs) / len(jobs),
        "chosen_vs_fastest_median": sorted(j["chosen_slower_than_fastest"] for j in jobs)[len(jobs) // 2],
        "prediction_error": {k: {"n": len(v), **error_summary(v)} for k, v in sorted(errors.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None, help="job seed (default: a fresh one, recorded)")
    parser.add_argument("--budget-s", type=float, default=300, help="calibration budget when no --tracking-uri")
    parser.add_argument("--tracking-uri", help="use the champion registered here instead of calibrating")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps of each layout per round")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/parallelism_selection.json"))
    args = parser.parse_args()
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    print(f"{args.jobs} jobs drawn with --seed {args.seed}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        fingerprint, model = champion_on_ray(Path(tmp), args.tracking_uri, args.budget_s, args.seed)
        import ray

        ray.shutdown()  # the races below use the host's cores, not Ray
        jobs = [run_job(i, args, fingerprint, model) for i in range(args.jobs)]
    summary = summarize(jobs)
    print(json.dumps(summary, indent=1))
    command = f"benchmarks/parallelism_selection.py --jobs {args.jobs} --world-size {args.world_size} "
    command += f"--seed {args.seed} --rounds {args.rounds} --steps {args.steps}"
    result = {"command": command, "seed": args.seed, "summary": summary, "jobs": jobs}
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

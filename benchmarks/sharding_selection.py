"""Does the sharding policy pick the plan that is really fastest? Every candidate run for real.

    .venv/bin/python benchmarks/sharding_selection.py [--tasks 10] [--tracking-uri URI] [--budget-s 300]

Calibrates this machine into a scratch MLflow store (or uses the champion registered under
`--tracking-uri`), draws random DLRM tasks with lookup-heavy tables (probes/workloads/
random_dlrm.py), and for each task:
- runs the sharding policy (`policies.sharding.choose_sharding`: six classic sharders, uniform
  row-/column-wise plans, and the local search over per-table sharding types);
- with torchrec installed, the policy's candidates include TorchRec's own planner on its cost
  constants (`torchrec`, the baseline: what a TorchRec user gets) and on our measured costs
  (`torchrec_measured`); the baseline runs even when our memory checks refuse its plan;
- runs every distinct feasible candidate for real on 2 gloo ranks in one Ray Train job, their
  timed steps interleaved in rotated rounds and each plan read against its rounds
  (`probes.workloads.plan_race`), so the host's drift cancels; the chosen plan runs twice,
  and the gap between its copies is the race's own noise (`control_gap`);
- scores the choice: success when the chosen plan is the measured fastest or within 10% of it
  (the anchor's criterion); also the best classic sharder alone (the anchor's own policy).
Prints a row per task and writes benchmarks/results/sharding_selection.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from e2e_accuracy import add_dlrm_task_arguments, champion_on_ray, draw_tasks, write_result  # noqa: E402

from orchestrator import ray_runtime  # noqa: E402
from orchestrator.launch import race_dlrm_plans  # noqa: E402
from policies.planning import memory_cap_bytes  # noqa: E402
from policies.sharders import SHARDERS  # noqa: E402
from policies.sharding import TORCHREC, choose_sharding  # noqa: E402

SUCCESS_WITHIN = 0.10


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dlrm_task_arguments(parser, tasks=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None, help="task seed (default: a fresh one, recorded)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/sharding_selection.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        fingerprint, model = champion_on_ray(scratch, args.tracking_uri, args.budget_s, 0)
        rows = []
        for spec in draw_tasks(args):
            cap = memory_cap_bytes(spec, fingerprint)
            t0 = time.perf_counter()
            decision = choose_sharding(
                spec, model, cap, seed=spec.seed, device_memory_bytes=fingerprint.min_device_memory_bytes
            )
            decide_s = time.perf_counter() - t0
            feasible = [c for c in decision.candidates if c.feasible]
            plans = {}  # distinct plans -> the candidate names that share them
            for c in feasible:
                plans.setdefault(json.dumps(c.detail["table_to_rank"]), []).append(c.name)
            baseline = next((c for c in decision.candidates if c.name == TORCHREC), None)
            why_not = None if baseline is not None else "torchrec is not installed"
            if baseline is not None and not baseline.feasible:
                plans.setdefault(json.dumps(baseline.detail["table_to_rank"]), []).append(TORCHREC)
            keys = list(plans)
            # The chosen plan runs twice (as its own control): the gap between its two copies is
            # the race's own noise, against which the candidates' gaps are read.
            choice_key = json.dumps(decision.choice_detail["table_to_rank"])
            results = race_dlrm_plans(
                spec,
                [json.loads(k) for k in keys + [choice_key]],
                rounds=args.rounds,
                steps_per_round=args.steps_per_round,
                storage=scratch / "ray_results",
            )
            control = results.pop()
            measured = {name: r.iteration_ms for k, r in zip(keys, results) for name in plans[k]}
            control_gap = abs(control.iteration_ms / measured[decision.choice] - 1)
            predicted = {c.name: c.predicted_ms for c in feasible}
            fastest = min(measured.values())
            best_sharder = min((c for c in feasible if c.name in SHARDERS), key=lambda c: c.predicted_ms).name
            row = {
                "name": spec.name,
                "tables": len(spec.tables),
                "batch_size": spec.batch_size,
                "choice": decision.choice,
                "choice_ms": measured[decision.choice],
                "fastest": min(measured, key=measured.get),
                "fastest_ms": fastest,
                "success": measured[decision.choice] <= (1 + SUCCESS_WITHIN) * fastest,
                "best_sharder": best_sharder,
                "best_sharder_ms": measured[best_sharder],
                "best_sharder_success": measured[best_sharder] <= (1 + SUCCESS_WITHIN) * fastest,
                "torchrec_ms": measured.get(TORCHREC),
                "torchrec_success": (measured[TORCHREC] <= (1 + SUCCESS_WITHIN) * fastest)
                if TORCHREC in measured
                else None,
                "decide_s": decide_s,
                "distinct_plans": len(keys),
                "control_gap": control_gap,
                "quiet_wait_s": control.quiet_wait_s,
                "host_quiet": control.host_quiet,
                "measured_ms": measured,
                "predicted_ms": predicted,
                "choice_plan": decision.choice_detail["table_to_rank"],
            }
            if why_not:
                row["torchrec_missing"] = why_not
            rows.append(row)
            tr = f"{row['torchrec_ms']:8.2f}" if row["torchrec_ms"] is not None else "       -"
            print(
                f"{row['name']:9s} T={row['tables']:2d} B={spec.batch_size:4d} plans={len(keys):2d}  "
                f"choice {decision.choice:18s} {row['choice_ms']:8.2f} ms  fastest {row['fastest']:18s} "
                f"{fastest:8.2f} ms  {'ok ' if row['success'] else 'MISS'}  best sharder {row['best_sharder_ms']:8.2f}"
                f"  torchrec {tr}  control gap {control_gap:5.1%}  (decided in {decide_s:.1f}s)",
                flush=True,
            )
        ray_runtime.shutdown()

    with_torchrec = [r for r in rows if r["torchrec_ms"] is not None]
    result = {
        "hardware_id": fingerprint.hardware_id,
        "command": f"python benchmarks/sharding_selection.py --tasks {args.tasks} --scale {args.scale:g} "
        f"--rounds {args.rounds} --steps-per-round {args.steps_per_round} --seed {args.seed}"
        + (" --tracking-uri URI" if args.tracking_uri else f" --budget-s {args.budget_s:g}"),
        "success_within": SUCCESS_WITHIN,
        "success_rate": sum(r["success"] for r in rows) / len(rows),
        "best_sharder_success_rate": sum(r["best_sharder_success"] for r in rows) / len(rows),
        "torchrec_success_rate": (
            sum(r["torchrec_success"] for r in with_torchrec) / len(with_torchrec) if with_torchrec else None
        ),
        "geomean_time_vs_torchrec": (
            geomean([r["choice_ms"] / r["torchrec_ms"] for r in with_torchrec]) if with_torchrec else None
        ),
        "geomean_time_vs_fastest": geomean([r["choice_ms"] / r["fastest_ms"] for r in rows]),
        "median_control_gap": sorted(r["control_gap"] for r in rows)[len(rows) // 2],
        "tasks": rows,
    }
    out = write_result(args.out, result)
    vs = result["geomean_time_vs_torchrec"]
    print(
        f"success {result['success_rate']:.0%} (best classic sharder alone {result['best_sharder_success_rate']:.0%}) "
        f"over {len(rows)} tasks; ours / fastest {result['geomean_time_vs_fastest']:.3f}; ours / TorchRec "
        + (f"{vs:.3f}" if vs is not None else "n/a (torchrec not installed)")
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

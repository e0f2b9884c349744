"""Trace importer round trip: capture real 2-rank DLRM steps, import them as execution graphs,
simulate, and compare with the measured step time of the same run.

    .venv/bin/python benchmarks/trace_roundtrip.py [--tasks 4] [--tracking-uri URI]

Each task (probes/workloads/random_dlrm.py) runs on 2 gloo ranks in spawned processes; the
last of a few profiled steps is captured per rank (probes/trace_capture.py) and imported
(predictors/trace_graph.py). Every captured step is imported and simulated; the median simulated step is compared with the
median measured step (from the earliest rank's start to the latest rank's end, on the host's
monotonic clock), with every single step's error beside it. The simulator has only measured op durations, issue gaps
and the shortest-rank transfer time of every collective: it must rebuild the waiting itself.
With `--tracking-uri`, the GEMMs that really ran are also priced by the registered model, per
distinct shape. Writes benchmarks/results/trace_roundtrip.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from predictors.simulator import simulate  # noqa: E402
from predictors.trace_graph import compare_gemms, graph_from_traces, measured_iteration_s  # noqa: E402
from probes.trace_capture import capture_step_trace  # noqa: E402
from probes.vocabulary.ops import gemm_params  # noqa: E402
from probes.workloads.dlrm import ShardedDLRM, cycling_step  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def _rank(rank: int, init: str, out: str, job: dict, placement: list[int]) -> None:
    from probes.vocabulary.jobspec import JobSpec

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        model = ShardedDLRM(JobSpec.from_dict(job), placement, rank, 2, torch.device("cpu"))
        trace = capture_step_trace(cycling_step(model), iterations=5, warmup=3, barrier=dist.barrier)
        Path(f"{out}/{rank}.json").write_text(json.dumps(trace))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def capture(job: dict, placement: list[int]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(f"{tmp}/init", tmp, job, placement), nprocs=2)
        return [json.loads(Path(f"{tmp}/{r}.json").read_text()) for r in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracking-uri", help="also price the traced GEMMs with the champion registered here")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/trace_roundtrip.json"))
    args = parser.parse_args()

    model = None
    if args.tracking_uri:
        from orchestrator import registry
        from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

        registry.configure(args.tracking_uri)
        hardware_id = HardwareFingerprint([local_node_fingerprint()]).hardware_id
        model = registry.load_performance_model(args.tracking_uri, hardware_id)

    rows = []
    for spec in random_dlrm_tasks(args.tasks, 2, args.seed, args.scale):
        placement = [i % 2 for i in range(len(spec.tables))]
        traces = capture(spec.to_dict(), placement)
        # Every captured step, imported and simulated against its own measured time.
        steps, skipped = [], []
        for k in range(len(traces[0]["steps"])):
            per_rank = [t["steps"][k] for t in traces]
            hosts = [t.get("host") for t in traces]
            try:
                graph = graph_from_traces(per_rank, hosts)
            except ValueError as exc:  # the profiler lost a work item on one rank: not importable
                skipped.append({"step": k, "why": str(exc)})
                print(f"{spec.name}: step {k} skipped: {exc}", flush=True)
                continue
            sim = simulate(graph, cost=lambda op: 0.0, share_links=False)  # measured transfers include it
            measured = measured_iteration_s(per_rank, hosts)
            steps.append((abs(sim.iteration_s - measured) / measured, measured, sim, graph, per_rank))
        # The run's iteration time is the median step (as the launcher reports it); this VM's
        # scheduling noise moves single steps by up to ~30%, so medians are compared.
        measured = float(np.median([s[1] for s in steps]))
        simulated = float(np.median([s[2].iteration_s for s in steps]))
        error = abs(simulated - measured) / measured
        _, _, sim, graph, per_rank = sorted(steps, key=lambda s: s[1])[len(steps) // 2]
        row = {
            "name": spec.name,
            "tables": len(spec.tables),
            "batch_size": spec.batch_size,
            "measured_ms": measured * 1e3,
            "unprofiled_ms": max(t["unprofiled_step_s"] for t in traces) * 1e3,
            "simulated_ms": simulated * 1e3,
            "error": error,
            "step_errors": [s[0] for s in steps],
            "skipped_steps": skipped,
            "waiting_ms": [t.waiting_s * 1e3 for t in sim.ranks],
            "collectives": len(per_rank[0]["comm"]),
            "ops_rank0": len(graph.ranks[0]),
        }
        if model is not None:
            gemms = compare_gemms(
                graph, lambda m, n, k, v, b: model.predict("gemm", **gemm_params(m, n, k, variant=v, batch=b))
            )
            measured_gemm = sum(g["measured_s"] * g["count"] for g in gemms)
            predicted_gemm = sum(g["predicted_s"] * g["count"] for g in gemms)
            row.update(
                {"gemm_measured_ms": measured_gemm * 1e3, "gemm_predicted_ms": predicted_gemm * 1e3, "gemms": gemms}
            )
        rows.append(row)
        extra = (
            f"  traced GEMMs {row['gemm_measured_ms']:.2f} ms vs model {row['gemm_predicted_ms']:.2f} ms"
            if model is not None
            else ""
        )
        print(
            f"{spec.name:9s} measured {row['measured_ms']:7.2f} ms (unprofiled {row['unprofiled_ms']:7.2f})  "
            f"simulated {row['simulated_ms']:7.2f} ms  error {row['error']:5.1%}  "
            f"waiting {', '.join(f'{w:.2f}' for w in row['waiting_ms'])} ms{extra}",
            flush=True,
        )
    out = {
        "command": f"python benchmarks/trace_roundtrip.py --tasks {args.tasks} --scale {args.scale:g} --seed {args.seed}",
        "tasks": rows,
        "max_error": max(r["error"] for r in rows),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"max round-trip error {out['max_error']:.1%} over {len(rows)} tasks; wrote {args.out}")


if __name__ == "__main__":
    main()

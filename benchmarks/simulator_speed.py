"""How fast the critical-path simulator prices one iteration, in Python on one core.

    .venv/bin/python benchmarks/simulator_speed.py [--repeats 5]

Targets (issue #5): an 8-rank DLRM with 100 tables under 50 ms, a 64-rank job under 1 s.
Graphs are built from random tasks (probes/workloads/random_dlrm.py) with 100 tables spread
round-robin, and a 64-rank data x tensor parallel block stack; op costs come from a fixed
cheap function so only the simulator (and, reported apart, the graph builder) is timed.
Writes benchmarks/results/simulator_speed.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from predictors.dlrm_graph import build_dlrm_graph  # noqa: E402
from predictors.simulator import simulate  # noqa: E402
from predictors.transformer_graph import build_transformer_graph  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_job  # noqa: E402


def fixed_cost(op) -> float:
    return 1e-3 if op.kind == "collective" else 1e-5 + float(op.params.get("flops", 0.0)) * 1e-11


def dlrm_with_tables(world: int, tables: int) -> tuple[JobSpec, list[int]]:
    job = random_dlrm_job(0, world, seed=0, scale=0.05)
    base = job["tables"]
    job["tables"] = [{**base[i % len(base)], "name": f"t{i}"} for i in range(tables)]
    return JobSpec.from_dict(job), [i % world for i in range(tables)]


def time_case(name: str, build, repeats: int) -> dict:
    t0 = time.perf_counter()
    graph = build()
    build_s = time.perf_counter() - t0
    # Again, as a planner pricing another plan of the same job does: per-table figures are cached.
    t0 = time.perf_counter()
    build()
    rebuild_s = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        simulate(graph, fixed_cost, synchronous=False)
        runs.append(time.perf_counter() - t0)
    ops = sum(len(r) for r in graph.ranks)
    row = {
        "case": name,
        "ranks": graph.world_size,
        "ops": ops,
        "build_ms": build_s * 1e3,
        "rebuild_ms": rebuild_s * 1e3,
        "simulate_ms": statistics.median(runs) * 1e3,
    }
    print(
        f"{name:34s} ranks {row['ranks']:3d}  ops {ops:6d}  build {row['build_ms']:8.1f} ms  "
        f"(again {row['rebuild_ms']:8.1f} ms)  simulate {row['simulate_ms']:8.1f} ms",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/simulator_speed.json"))
    args = parser.parse_args()
    rows = [
        time_case("dlrm 8 ranks, 100 tables", lambda: build_dlrm_graph(*dlrm_with_tables(8, 100)), args.repeats),
        time_case("dlrm 64 ranks, 832 tables", lambda: build_dlrm_graph(*dlrm_with_tables(64, 832)), args.repeats),
        time_case(
            "transformer 64 ranks (8 DP x 8 TP)",
            lambda: build_transformer_graph(
                TransformerSpec(
                    layers=24, hidden=1024, heads=16, seq_len=1024, batch_size=4, world_size=64, tensor_parallel=8
                )
            ),
            args.repeats,
        ),
    ]
    result = {
        "command": f"python benchmarks/simulator_speed.py --repeats {args.repeats}",
        "cases": rows,
        "targets_ms": {"dlrm 8 ranks, 100 tables": 50, "64 ranks": 1000},
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Reproduce the Themis paper's all-reduce result with the chunk simulator (issue #7).

    .venv/bin/python benchmarks/themis_reproduction.py [--chunks 64]

All-reduces of 100 MB .. 1 GB (steps of 100 MB) on the paper's six 1024-NPU topologies
(predictors/network.py, its Table 2 with its link latencies), each cut into 64 chunks, under
the baseline schedule, Themis+FIFO and Themis+SCF. Prints the average bandwidth utilisation
and speedups beside the paper's (56.31%, 87.67%, 95.14%; 1.58x and 1.72x), per topology the
1 GB times, and how the averages move with the two modelling knobs the paper leaves open: how
many chunk phases a dimension overlaps (`max_active`) and the link latency (the paper's
artefact configs run one chunk per dimension with 1 ns links). Also times the issue's speed
target: a 1024-NPU 1 GB all-reduce with 64 chunks. Writes
benchmarks/results/themis_reproduction.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from predictors.chunk_sim import DEFAULT_MAX_ACTIVE, SCHEDULES, simulate_all_reduce  # noqa: E402
from predictors.network import PAPER_TOPOLOGIES, NetworkTopology, preset  # noqa: E402

PAPER = {
    "average_utilization": {"baseline": 0.5631, "themis_fifo": 0.8767, "themis_scf": 0.9514},
    "speedup": {"themis_fifo": 1.58, "themis_scf": 1.72},
}
SIZES = [100e6 * k for k in range(1, 11)]


def with_latency(topology: NetworkTopology, latency_us: float | None) -> NetworkTopology:
    if latency_us is None:
        return topology
    return NetworkTopology(topology.name, tuple(dataclasses.replace(d, latency_us=latency_us) for d in topology.dims))


def sweep(chunks: int, max_active: int | None, latency_us: float | None = None) -> dict:
    """Average utilisation and speedup over every topology and size, and per topology."""
    util = {s: [] for s in SCHEDULES}
    speed = {s: [] for s in SCHEDULES if s != "baseline"}
    per_topology = {}
    for name in PAPER_TOPOLOGIES:
        topology = with_latency(preset(name), latency_us)
        rows = {s: [] for s in SCHEDULES}
        for size in SIZES:
            times = {}
            for schedule in SCHEDULES:
                r = simulate_all_reduce(topology, size, chunks, schedule, max_active=max_active)
                times[schedule] = r.time_s
                util[schedule].append(r.utilization)
                rows[schedule].append({"bytes": size, "time_ms": r.time_s * 1e3, "utilization": r.utilization})
            for schedule in speed:
                speed[schedule].append(times["baseline"] / times[schedule])
        per_topology[name] = {
            "average_utilization": {s: statistics.fmean(x["utilization"] for x in rows[s]) for s in SCHEDULES},
            "speedup": {
                s: statistics.fmean(a["time_ms"] / b["time_ms"] for a, b in zip(rows["baseline"], rows[s]))
                for s in speed
            },
            "sizes": rows,
        }
    return {
        "average_utilization": {s: statistics.fmean(v) for s, v in util.items()},
        "speedup": {s: statistics.fmean(v) for s, v in speed.items()},
        "per_topology": per_topology,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "themis_reproduction.json"))
    args = parser.parse_args()

    main_run = sweep(args.chunks, DEFAULT_MAX_ACTIVE)
    print(f"All-reduce 100 MB-1 GB, {args.chunks} chunks, six 1024-NPU topologies, max_active={DEFAULT_MAX_ACTIVE}")
    print(f"{'':22s} {'ours':>8s} {'paper':>8s} {'gap (pts)':>10s}")
    for s in SCHEDULES:
        ours, paper = main_run["average_utilization"][s], PAPER["average_utilization"][s]
        print(f"utilisation {s:10s} {ours:8.2%} {paper:8.2%} {100 * (ours - paper):+10.2f}")
    for s in ("themis_fifo", "themis_scf"):
        print(f"speedup     {s:10s} {main_run['speedup'][s]:7.2f}x {PAPER['speedup'][s]:7.2f}x")
    print("\nper topology at 1 GB: time ms (utilisation)")
    for name, row in main_run["per_topology"].items():
        cells = "  ".join(
            f"{s} {row['sizes'][s][-1]['time_ms']:6.2f} ({row['sizes'][s][-1]['utilization']:.0%})" for s in SCHEDULES
        )
        print(f"  {name:20s} {cells}")

    sensitivity = []
    for max_active, latency_us, label in (
        (1, None, "one phase per dimension, paper latencies"),
        (4, None, "4 overlapped, paper latencies"),
        (8, None, "8 overlapped, paper latencies (default)"),
        (None, None, "no cap, paper latencies"),
        (1, 0.001, "one phase per dimension, 1 ns links (artefact configs)"),
    ):
        run = (
            main_run
            if (max_active, latency_us) == (DEFAULT_MAX_ACTIVE, None)
            else sweep(args.chunks, max_active, latency_us)
        )
        sensitivity.append(
            {
                "label": label,
                "max_active": max_active,
                "latency_us": latency_us,
                "average_utilization": run["average_utilization"],
                "speedup": run["speedup"],
            }
        )
    print("\nsensitivity: baseline / themis_fifo / themis_scf utilisation, speedups")
    for row in sensitivity:
        u, sp = row["average_utilization"], row["speedup"]
        print(
            f"  {row['label']:55s} {u['baseline']:6.1%} {u['themis_fifo']:6.1%} {u['themis_scf']:6.1%}"
            f"   {sp['themis_fifo']:.2f}x {sp['themis_scf']:.2f}x"
        )

    big = preset("4D-Ring_FC_Ring_SW")
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        simulate_all_reduce(big, 1e9, 64, "themis_scf")
        runs.append(time.perf_counter() - t0)
    speed_s = min(runs)
    print(f"\n1024-NPU 1 GB all-reduce, 64 chunks, themis_scf: simulated in {speed_s * 1e3:.1f} ms (target < 1 s)")

    out = {
        "command": "benchmarks/themis_reproduction.py" + (f" --chunks {args.chunks}" if args.chunks != 64 else ""),
        "chunks": args.chunks,
        "sizes_bytes": SIZES,
        "max_active": DEFAULT_MAX_ACTIVE,
        "average_utilization": main_run["average_utilization"],
        "speedup": main_run["speedup"],
        "paper": PAPER,
        "per_topology": main_run["per_topology"],
        "sensitivity": sensitivity,
        "simulate_1024_npu_1gb_64_chunks_s": speed_s,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""A calibration's kernel and collective fit, in this process and over a pool of worker
processes, side by side on the same stored rows: wall time of each and whether the bundles
are the same.

    .venv/bin/python benchmarks/fit_speed.py [ROWS] [--ops OP,OP] [--rounds N] [--workers N]

ROWS: a calibration's `measurements.jsonl(.gz)` (default: #26's 12-02 03:36 cycle, 1187
points). Each round fits `predictors.fit.fit_performance_model` on the kernel rows once each
way, the order alternating between rounds (the host's speed drifts: the ratio is taken within
a round). The bundles are compared as JSON (`PerformanceModel.to_dict`, with the metrics and
the rows each judged): the pool must change where the fits run, not what they give. Not bit
for bit: a worker's BLAS runs on one thread, this process's on all its cores, so a sum inside
a matrix product may round differently (the MLP candidates' validation scores, in the 16th
digit); every key, choice and string must match, and every number within `REL_TOL`.
Writes benchmarks/results/fit_speed.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.fit import fit_performance_model, kernel_rows  # noqa: E402
from predictors.fit_pool import in_process, worker_pool  # noqa: E402

DEFAULT_ROWS = REPO / "benchmarks/results/e2e_issue26_20261202/measurements_0336.jsonl.gz"
OUT = REPO / "benchmarks/results/fit_speed.json"


REL_TOL = 1e-9  # what a number of the pool's bundle may differ from the serial one's, relatively


def fitted(rows: list, mapper) -> tuple[float, Any]:
    """Seconds to fit `rows` through `mapper`, and the bundle and its judged rows as plain JSON."""
    t0 = time.perf_counter()
    model, judged = fit_performance_model(rows, "fit-speed", mapper=mapper)
    seconds = time.perf_counter() - t0
    shown = {"bundle": model.to_dict(), "judged": [r.to_row() for r in judged]}
    return seconds, json.loads(json.dumps(shown, default=str))


def differences(a: Any, b: Any, path: str = "") -> tuple[list[str], float]:
    """Where two JSON values differ in anything but a number's last digits (paths), and the
    largest relative difference of their numbers."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        if type(a) is not type(b):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"], 0.0
        if isinstance(a, dict):
            if list(a) != list(b):
                return [f"{path}: keys differ"], 0.0
            parts = [differences(a[k], b[k], f"{path}/{k}") for k in a]
        elif isinstance(a, list):
            if len(a) != len(b):
                return [f"{path}: {len(a)} vs {len(b)} items"], 0.0
            parts = [differences(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
        else:
            return ([] if a == b else [f"{path}: {a!r} vs {b!r}"]), 0.0
        return [p for found, _ in parts for p in found], max((rel for _, rel in parts), default=0.0)
    if a == b or (math.isnan(a) and math.isnan(b)):
        return [], 0.0
    rel = abs(a - b) / max(abs(a), abs(b))
    return ([f"{path}: {a!r} vs {b!r}"] if rel > REL_TOL else []), rel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="?", default=str(DEFAULT_ROWS))
    parser.add_argument("--ops", default="", help="comma-separated ops to fit (default: every kernel op)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: the cores this process may use)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    rows = kernel_rows(read_rows(Path(args.rows)))
    if args.ops:
        wanted = set(args.ops.split(","))
        rows = [r for r in rows if r.op in wanted]
    pool = worker_pool(args.workers)
    ways = {"in_process": in_process, "pool": pool}
    rounds = []
    for k in range(args.rounds):
        order = list(ways) if k % 2 == 0 else list(reversed(ways))
        timed = {name: fitted(rows, ways[name]) for name in order}
        differ, rel = differences(timed["in_process"][1], timed["pool"][1])
        same = not differ
        for where in differ[:5]:
            print(f"  differs at {where}")
        ratio = timed["pool"][0] / timed["in_process"][0]
        rounds.append(
            {
                "order": order,
                **{f"{n}_s": timed[n][0] for n in ways},
                "pool_over_serial": ratio,
                "same": same,
                "max_relative_difference": rel,
            }
        )
        print(
            f"round {k + 1}: in process {timed['in_process'][0]:.1f} s, pool {timed['pool'][0]:.1f} s "
            f"({ratio:.2f}x), bundles {'the same' if same else 'DIFFER'} (largest relative difference {rel:.1e})",
            flush=True,
        )
    ratios = np.array([r["pool_over_serial"] for r in rounds])
    import joblib

    record = {
        "command": "python benchmarks/fit_speed.py " + " ".join(sys.argv[1:]),
        "rows": args.rows,
        "kernel_rows": len(rows),
        "ops": sorted({r.op for r in rows}),
        "workers": args.workers or joblib.cpu_count(),
        "rounds": rounds,
        "pool_over_serial_median": float(np.median(ratios)),
        "pool_over_serial_range": [float(ratios.min()), float(ratios.max())],
        "all_same": all(r["same"] for r in rounds),
        "rel_tol": REL_TOL,
    }
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(
        f"pool/serial median {record['pool_over_serial_median']:.2f}x "
        f"(range {ratios.min():.2f}-{ratios.max():.2f}, {len(rounds)} round(s)); "
        f"the same in every round: {record['all_same']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()

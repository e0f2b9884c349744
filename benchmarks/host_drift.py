"""How fast the host runs now against when a calibration measured it: a seeded sample of the
calibration's own local kernel points (GEMM, element-wise, memcpy, embedding) measured again, here, as the
calibration measures them (`--workers` processes at once, one per device it probed, each on one
thread, the points dealt in turn), and each point's time now over its stored median.

    .venv/bin/python benchmarks/host_drift.py --calibration-dir DIR [--points 60] [--seed 0] [--workers 2]

The end-to-end benchmarks compare a model fitted on rows measured at one time with jobs run at
another; on a shared host the same kernels can run a quarter slower an hour later, and every
task's error then leans the same way whatever the model. Run this right after an end-to-end
benchmark: a geomean ratio far from 1 says the host moved since the calibration (the drift
the nightly's sentinels exist to catch), not the model. Writes
benchmarks/results/host_drift.json (or `--out`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from probes.probe import ProbeSpec  # noqa: E402
from probes.sweep import run_local_probe  # noqa: E402
from probes.vocabulary.indices import Distribution  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

# local kernels a point's params re-run as stored (an embedding row keeps its tables and batch;
# its index draw is seed 0's, the same distribution as the stored draw)
FAMILIES = ("gemm", "elementwise", "memcpy", "embedding")
MIN_STORED_S = 2e-5  # shorter points are mostly timer and launch jitter on a CPU host


def stored_rows(directory: Path) -> list[Measurement]:
    """The calibration's local kernel rows of `FAMILIES`, as stored."""
    from orchestrator.measurement_store import MeasurementStore

    return [r for r in MeasurementStore(directory).rows() if r.family in FAMILIES and r.median_s >= MIN_STORED_S]


def rerun_params(row: Measurement) -> dict:
    """The probe params that measure `row`'s point again: an embedding row stores its tables'
    distributions as labels, the probe takes them as specs."""
    if row.family != "embedding":
        return row.params
    tables = [
        [e, d, pooling, Distribution.from_label(label).to_json()] for e, d, pooling, label in row.params["tables"]
    ]
    return {"tables": tables, "B": row.params["B"], "weights_precision": row.params.get("weights_precision", "fp32")}


def remeasure(rows: list[Measurement]) -> list[tuple[str, float]]:
    """(family, time now over the stored median) of each row, measured in this process on one
    thread, as a probe actor runs its points."""
    import torch

    torch.set_num_threads(1)
    out = []
    for i, row in enumerate(rows):
        now = [m for m in run_local_probe(ProbeSpec(row.family, rerun_params(row), f"drift:{i}")) if m.op == row.op]
        if now:
            out.append((row.family or row.op, now[0].median_s / row.median_s))
    return out


def remeasure_at_once(rows: list[Measurement], workers: int) -> dict[str, list[float]]:
    """Per family, the rows' ratios, the rows dealt in turn to `workers` processes measuring at
    once: the calibration runs one probe actor per device, so on a host whose devices share
    memory and caches a lone process would time the same points faster (a lone process read
    0.88x a 90 s calibration's points minutes after it)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        shares = list(pool.map(remeasure, [rows[w::workers] for w in range(workers)]))
    ratios: dict[str, list[float]] = {}
    for family, ratio in (pair for share in shares for pair in share):
        ratios.setdefault(family, []).append(ratio)
    return ratios


def summary(ratios: list[float]) -> dict[str, float | None]:
    if not ratios:  # every point failed to run again
        return {"n": 0, "geomean_ratio": None, "p25": None, "p75": None}
    r = np.asarray(ratios)
    return {
        "n": len(r),
        "geomean_ratio": float(np.exp(np.mean(np.log(r)))),
        "p25": float(np.percentile(r, 25)),
        "p75": float(np.percentile(r, 75)),
    }


def describe(s: dict) -> str:
    """A summary's geomean ratio and quartiles in a few words."""
    if s["geomean_ratio"] is None:
        return "no point ran again"
    return f"geomean {s['geomean_ratio']:.3f} (p25 {s['p25']:.3f}, p75 {s['p75']:.3f})"


def sample_points(directory: Path, points: int = 60, seed: int = 0) -> tuple[list[Measurement], int]:
    """A seeded sample of `points` of the calibration in `directory`'s kernel points, and how
    many it stores. ValueError when it stores none."""
    rows = stored_rows(directory)
    if not rows:
        raise ValueError(f"no {', '.join(FAMILIES)} rows of {MIN_STORED_S * 1e6:.0f} us or more in {directory}")
    return random.Random(seed).sample(rows, min(points, len(rows))), len(rows)


def speed_of(picked: list[Measurement], stored: int, workers: int = 2) -> dict:
    """`picked` (from `sample_points`) measured again (`remeasure_at_once`): per family and
    over all, the geomean of time now over then."""
    ratios = remeasure_at_once(picked, workers)
    return {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stored_points": stored,
        "families": {family: summary(r) for family, r in sorted(ratios.items())},
        "all": summary([x for r in ratios.values() for x in r]),
    }


def host_speed(directory: Path, points: int = 60, seed: int = 0, workers: int = 2) -> dict:
    """`speed_of` a fresh `sample_points` of the calibration in `directory`."""
    return speed_of(*sample_points(directory, points, seed), workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--calibration-dir", type=Path, required=True, help="a calibration's directory (measurements.jsonl)"
    )
    parser.add_argument("--points", type=int, default=60, help="how many of its kernel points to measure again")
    parser.add_argument("--seed", type=int, default=0, help="which points (a seeded sample)")
    parser.add_argument(
        "--workers", type=int, default=2, help="processes measuring at once (the calibration's devices)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "host_drift.json")
    args = parser.parse_args()
    if not (args.calibration_dir / "measurements.jsonl").is_file():
        parser.error(f"--calibration-dir: no measurements.jsonl in {args.calibration_dir}")
    if args.points < 1:
        parser.error(f"--points: expected a count >= 1, got {args.points}")
    if args.workers < 1:
        parser.error(f"--workers: expected a count >= 1, got {args.workers}")
    print(
        f"measuring {args.points} stored kernel points of {args.calibration_dir} again "
        f"({args.workers} process(es) at once)",
        flush=True,
    )
    try:
        speed = host_speed(args.calibration_dir, args.points, args.seed, args.workers)
    except ValueError as exc:
        parser.error(f"--calibration-dir: {exc}")
    for family, s in {**speed["families"], "all": speed["all"]}.items():
        print(f"{family:12s} n={s['n']:3d}  now / then: {describe(s)}")
    write_result(
        args.out,
        {
            "command": " ".join(["python", *sys.argv]),
            "calibration_dir": str(args.calibration_dir),
            "seed": args.seed,
            "workers": args.workers,
            **speed,
        },
    )


if __name__ == "__main__":
    main()

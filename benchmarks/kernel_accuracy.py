"""Held-out accuracy of the per-op models from a fresh calibration on this machine.

    .venv/bin/python benchmarks/kernel_accuracy.py [--budget-s 300] [--noise-points 80]
        [--calibration-json FILE]   # the saved `calibrate --json` line of an earlier run

1. `python -m orchestrator.cli.calibrate --budget-s B` in a scratch directory (its own MLflow);
   per op: held-out GMAE / MAPE of our model and of the baseline, on the same 20% of rows.
2. The measurement noise floor: `--noise-points` points of every local family measured twice
   in this process, a full pass apart, and `--collective-noise-points` sizes of every
   collective measured twice the same way on two gloo processes; per op, the GMAE between
   the two measurements is the error a perfect model would still show against a single one.
3. Collectives only: 5-fold cross-validation over all of an op's rows, ours and alpha-beta,
   because one 20% split leaves ~9 rows per collective.
Writes benchmarks/results/kernel_accuracy_<hardware_id>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def calibrate(budget_s: float) -> tuple[dict, list]:
    """Run the calibration CLI in a scratch directory; its JSON summary and measured rows."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli.calibrate", "--budget-s", str(budget_s), "--json"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit("calibration failed")
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        return info, load_rows(Path(scratch) / info["measurements"])


def load_rows(path: Path) -> list:
    from probes.collective import merge_passes
    from probes.vocabulary.records import Measurement

    return merge_passes(
        [Measurement.from_row(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    )


def collective_cross_validation(rows: list, folds: int = 5, seed: int = 0) -> dict[str, dict]:
    """Per collective, every row predicted once by a model fitted on the other folds: the
    sigmoid model and alpha-beta compared on all of an op's rows, not on the ~9 rows of one
    held-out split, whose GMAE moves by several points with the split."""
    from predictors.evaluation import error_stats, relative_errors
    from predictors.families import COLLECTIVES, baseline_model_for, default_model_for

    out = {}
    for op in COLLECTIVES:
        items = [r for r in rows if r.op == op]
        if len(items) < 2 * folds:
            continue
        assignment = np.random.default_rng(seed).permutation(len(items)) % folds
        ours, base = [], []
        for f in range(folds):
            train = [r for r, a in zip(items, assignment) if a != f]
            test = [r for r, a in zip(items, assignment) if a == f]
            ours.extend(relative_errors(default_model_for(op).fit(train).predict, test))
            base.extend(relative_errors(baseline_model_for(op).fit(train).predict, test))
        out[op] = {
            "cv_gmae": error_stats(np.asarray(ours)).gmae,
            "cv_baseline_gmae": error_stats(np.asarray(base)).gmae,
            "folds": folds,
            "n": len(items),
        }
    return out


def noise_floor(points: int, seed: int = 11) -> dict[str, float]:
    """GMAE between two measurements of the same points, taken a full pass apart (not back to
    back: the machine's state drifts between passes, as it does between a calibration's
    training and test rows)."""
    import torch

    from probes.elementwise import elementwise_specs
    from probes.embedding import embedding_specs
    from probes.gemm import gemm_specs
    from probes.memcpy import memcpy_specs
    from probes.sweep import run_local_probe

    torch.set_num_threads(1)
    specs = (
        gemm_specs(points, seed)
        + embedding_specs(points, seed)
        + elementwise_specs(points, seed)
        + memcpy_specs(points, seed)
    )

    def one_pass() -> list:
        return [row for spec in specs for row in run_local_probe(spec)]

    first, second = one_pass(), one_pass()
    errors: dict[str, list[float]] = {}
    for a, b in zip(first, second):
        errors.setdefault(a.op, []).append(abs(a.median_s - b.median_s) / b.median_s)
    return {op: float(np.exp(np.mean(np.log(np.maximum(e, 1e-6))))) for op, e in sorted(errors.items())}


def _collective_noise_worker(rank: int, init_file: str, points: int, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from probes.collective import forget_groups, merge_passes
    from probes.collective_sweep import COLLECTIVE_PASSES, collective_batch_bytes, collective_pass_timing
    from probes.probe import ProbeSpec
    from probes.sweep import collective_batches, run_collective_batch
    from probes.vocabulary.ops import COLLECTIVE_OPS

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        sizes = np.unique(np.geomspace(64, 64 * 2**20, points).astype(int))
        variants = [(op, False) for op in COLLECTIVE_OPS] + [("all_to_all", True)]
        specs = [
            ProbeSpec("collective", {"op": op, "bytes": int(b), "uneven": uneven, "seed": int(b) % 97})
            for b in sizes
            for op, uneven in variants
        ]
        # as the calibration runs them: in batches, visited in passes merged per point
        batches = collective_batches(specs, max_bytes=collective_batch_bytes("cpu"))
        timing = collective_pass_timing(COLLECTIVE_PASSES)
        passes = [
            merge_passes(
                [
                    row
                    for _ in range(COLLECTIVE_PASSES)
                    for batch in batches
                    for row in run_collective_batch(batch, timing=timing)
                ]
            )
            for _ in range(2)
        ]
        if rank == 0:
            errors: dict[str, list[float]] = {}
            for a, b in zip(*passes):
                key = a.op + ("_uneven" if a.params.get("uneven") else "")
                errors.setdefault(key, []).append(abs(a.median_s - b.median_s) / b.median_s)
            Path(out_file).write_text(json.dumps(errors))
    finally:
        forget_groups()
        dist.destroy_process_group()


def collective_noise_floor(points: int) -> dict[str, float]:
    """The same pass-apart repeat GMAE for collectives, on two gloo processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_collective_noise_worker, args=(f"{tmp}/init", points, f"{tmp}/errors.json"), nprocs=2)
        errors = json.loads(Path(f"{tmp}/errors.json").read_text())
    # the uneven all-to-all shares the all_to_all op (and its held-out rows): pool them
    pooled: dict[str, list[float]] = {}
    for key, e in errors.items():
        pooled.setdefault(key.replace("_uneven", ""), []).extend(e)
    return {op: float(np.exp(np.mean(np.log(np.maximum(e, 1e-6))))) for op, e in sorted(pooled.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=300)
    parser.add_argument("--noise-points", type=int, default=80)
    parser.add_argument("--collective-noise-points", type=int, default=16)
    parser.add_argument(
        "--calibration-json", help="score a saved `orchestrator.cli.calibrate --json` output instead of calibrating"
    )
    args = parser.parse_args()
    if args.calibration_json:
        info = json.loads(Path(args.calibration_json).read_text().strip().splitlines()[-1])
        args.budget_s = float(info.get("budget_s", args.budget_s))
        rows = load_rows(Path(args.calibration_json).resolve().parent / info["measurements"])
    else:
        info, rows = calibrate(args.budget_s)
    cv = collective_cross_validation(rows)
    ops = {
        op: {"gmae": s["gmae"], "mape": s["mape"], "baseline_gmae": s.get("baseline_gmae"), "n_test": s["n"]}
        for op, s in info["heldout"].items()
    }
    noise = noise_floor(args.noise_points) if args.noise_points else {}
    if args.collective_noise_points:
        noise.update(collective_noise_floor(args.collective_noise_points))
    result = {
        "hardware_id": info["hardware_id"],
        "command": (
            f"python benchmarks/kernel_accuracy.py --budget-s {args.budget_s:g} --noise-points {args.noise_points}"
            f" --collective-noise-points {args.collective_noise_points}"
            + (" --calibration-json <the calibration's `calibrate --json` output>" if args.calibration_json else "")
        ),
        "budget_s": args.budget_s,
        "rows_per_family": info.get("rows_per_family", {}),
        "rows_per_op": info["rows_per_op"],
        "ops": ops,
        "repeat_measurement_gmae": noise,
        "collective_5fold": cv,
    }
    out = REPO / "benchmarks/results" / f"kernel_accuracy_{info['hardware_id']}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"hardware {info['hardware_id']}, calibration budget {args.budget_s:g}s")
    print(
        f"{'op':16s} {'rows':>6s} {'n_test':>6s} {'GMAE':>7s} {'MAPE':>7s} {'baseline GMAE':>14s} {'noise floor':>12s}"
    )
    for op, s in ops.items():
        base = f"{s['baseline_gmae']:.1%}" if s["baseline_gmae"] is not None else "-"
        floor = f"{noise[op]:.1%}" if op in noise else "-"
        print(
            f"{op:16s} {info['rows_per_op'].get(op, 0):6d} {s['n_test']:6d} {s['gmae']:7.1%} {s['mape']:7.1%} {base:>14s} {floor:>12s}"
        )
    for op, c in cv.items():
        print(
            f"{op:16s} 5-fold over all {c['n']} rows: GMAE {c['cv_gmae']:.1%}, alpha-beta {c['cv_baseline_gmae']:.1%}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Fused compute + collective substitution: the policy's decision against both forms measured.

    .venv/bin/python benchmarks/substitution.py --tracking-uri URI [--threshold 0.05]

Loads the champion bundle for this machine from `--tracking-uri` (its kernel and collective
models price the slices). Its overlap costs (slice overhead, communication's compute share) are
the ones its calibration fitted when it has them; otherwise the calibration's own overlap points
(`probes.overlap.overlap_points`, sizes the sweep below does not use) are measured here first and
fitted, and the JSON says which. Then every sweep point, per pair a range of sizes on 2 gloo
ranks, is measured for real unfused and fused with 2/4/8/16 slices (interleaved rounds), and
the policy's decision (substitute iff the predicted best fused form is faster by more than the
threshold) is compared with the measured truth (the same rule on the measured times).
The ranks run with the allocator setting of `probes.host_allocator`, as the product's workers
do. Measured rows are appended to a JSONL file as they arrive. Writes
benchmarks/results/substitution.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from policies.substitution import DEFAULT_THRESHOLD, decide  # noqa: E402
from predictors.overlap_model import PairPrediction, group_rows_by_point  # noqa: E402
from predictors.pair_estimator import fit_overlap_calibration, predict_point  # noqa: E402
from probes.host_allocator import apply_to_child_processes  # noqa: E402
from probes.overlap import measure_pair, overlap_points  # noqa: E402
from probes.vocabulary.pairs import PairPoint  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

SWEEP = [
    PairPoint("gemm_all_reduce", 64, 64, 64),
    PairPoint("gemm_all_reduce", 512, 256, 256),
    PairPoint("gemm_all_reduce", 2048, 1024, 1024),
    PairPoint("gemm_all_reduce", 1024, 2048, 512),
    PairPoint("gemm_all_reduce", 8, 4096, 2048),
    PairPoint("gemm_all_reduce", 1, 8192, 1024),
    PairPoint("gemm_all_reduce", 4096, 512, 512),
    PairPoint("gemm_all_to_all", 128, 128, 128),
    PairPoint("gemm_all_to_all", 1024, 256, 512),
    PairPoint("gemm_all_to_all", 2048, 1024, 256),
    PairPoint("gemm_all_to_all", 4096, 512, 512),
    PairPoint("gemm_all_to_all", 2048, 512, 256, uneven=True, seed=3),
    PairPoint("gemm_all_to_all", 8192, 256, 128),
    PairPoint("gemm_all_to_all", 512, 2048, 256),
    PairPoint("embedding_all_to_all", 256, 32, tables=2),
    PairPoint("embedding_all_to_all", 1024, 64, tables=4),
    PairPoint("embedding_all_to_all", 4096, 128, tables=8, pooling=16),
    PairPoint("embedding_all_to_all", 8192, 256, tables=8, pooling=8),
    PairPoint("embedding_all_to_all", 2048, 128, tables=4, uneven=True, seed=3),
    PairPoint("embedding_all_to_all", 2048, 512, tables=8, pooling=4),
]


def _worker(rank: int, init: str, points: list[dict], rows_path: str, rounds: int, transfer: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        for i, params in enumerate(points):
            t0 = time.monotonic()
            rows = measure_pair(PairPoint(**params), rounds=rounds, transfer=transfer)
            if rank == 0:
                with open(rows_path, "a") as f:  # persisted before the next point can fail
                    for row in rows:
                        f.write(json.dumps(row.to_row()) + "\n")
                forms = " ".join(f"{r.extra['form']}={r.median_s * 1e3:.2f}" for r in rows)
                print(
                    f"[{i + 1}/{len(points)}] {params['pair']} {params['rows']}x{params['cols']}x{params['inner']}"
                    f"{' uneven' if params['uneven'] else ''}: {forms} ms ({time.monotonic() - t0:.1f}s)",
                    flush=True,
                )
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def measure(
    points: list[PairPoint], rows_path: Path, rounds: int, transfer: bool = False, tuned_allocator: bool = True
) -> list[Measurement]:
    """Both forms of every point on 2 gloo ranks (with `transfer`, the transfer-only forms too);
    the ranks run with the allocator setting the product's workers get, unless told not to."""
    rows_path.unlink(missing_ok=True)
    if tuned_allocator:
        apply_to_child_processes()
    else:
        os.environ.pop("GLIBC_TUNABLES", None)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(
            _worker, args=(f"{tmp}/init", [p.to_params() for p in points], str(rows_path), rounds, transfer), nprocs=2
        )
    return [Measurement.from_row(json.loads(line)) for line in rows_path.read_text().splitlines()]


def load_champion(uri: str):
    from orchestrator import ray_runtime, registry
    from orchestrator.cluster import cluster_fingerprint

    registry.configure(uri)
    ray_runtime.connect()
    fingerprint = cluster_fingerprint()
    model = registry.load_performance_model(uri, fingerprint.hardware_id)
    ray_runtime.shutdown()
    return fingerprint.hardware_id, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tracking-uri", required=True, help="MLflow store holding this machine's champion bundle")
    ap.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--refit", action="store_true", help="fit overlap costs here even if the bundle has them")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/substitution.json"))
    args = ap.parse_args()
    hardware_id, model = load_champion(args.tracking_uri)
    scratch = Path(tempfile.mkdtemp(prefix="substitution-"))

    calibration = model.overlap
    source = "bundle"
    if args.refit or not calibration.pairs:
        print(f"fitting overlap costs on {len(overlap_points(2))} calibration pairs measured now", flush=True)
        cal_rows = measure(overlap_points(2), scratch / "calibration_rows.jsonl", args.rounds, transfer=True)
        calibration = fit_overlap_calibration(model, cal_rows)
        model.overlap = calibration
        source = "fitted in this run on probes.overlap.overlap_points (sizes not in the sweep)"
    for pair, c in calibration.pairs.items():
        print(
            f"  {pair}: slice overhead {c.slice_overhead_s * 1e3:.3f} ms, compute share {c.comm_compute_share:.2f}, "
            f"ratio error {c.fit_gmae:.1%} on {c.n_points} pairs",
            flush=True,
        )

    rows = measure(SWEEP, scratch / "sweep_rows.jsonl", args.rounds)
    results = []
    for key, forms in group_rows_by_point(rows).items():
        point = PairPoint(**dict(key))
        measured = {k: r.median_s for k, r in forms.items()}
        costs = calibration.pairs[point.pair]
        choice = decide(predict_point(point, model, costs), args.threshold)
        truth = decide(PairPrediction(measured[1], {k: v for k, v in measured.items() if k > 1}), args.threshold)
        results.append(
            {
                "pair": point.pair,
                "point": point.to_params(),
                "measured_ms": {str(k): v * 1e3 for k, v in sorted(measured.items())},
                "predicted_ms": {
                    "1": choice.prediction.unfused_s * 1e3,
                    **{str(k): v * 1e3 for k, v in choice.prediction.fused_s.items()},
                },
                "decision": {
                    "substitute": choice.substitute,
                    "slices": choice.slices,
                    "predicted_gain": choice.prediction.gain(),
                },
                "truth": {
                    "substitute": truth.substitute,
                    "slices": truth.slices,
                    "measured_best_gain": truth.prediction.gain(),
                },
                "correct": choice.substitute == truth.substitute,
                "measured_gain_of_choice": (1 - measured[choice.slices] / measured[1]) if choice.substitute else None,
            }
        )
        r = results[-1]
        print(
            f"{point.pair:21s} {point.rows:5d}x{point.cols:5d}x{point.inner:5d}{'u' if point.uneven else ' '} "
            f"measured unfused {measured[1] * 1e3:8.2f} best fused k{truth.slices if truth.substitute else truth.prediction.best()[0]}"
            f" gain {truth.prediction.gain():+6.1%} | predicted gain {choice.prediction.gain():+6.1%} -> "
            f"{'substitute k' + str(choice.slices) if choice.substitute else 'keep unfused'}"
            f"{'' if r['correct'] else '  WRONG'}",
            flush=True,
        )

    substituted = [r for r in results if r["decision"]["substitute"]]
    per_pair = {}
    for pair in sorted({r["pair"] for r in results}):
        mine = [r for r in results if r["pair"] == pair]
        per_pair[pair] = {
            "points": len(mine),
            "decision_accuracy": sum(r["correct"] for r in mine) / len(mine),
            "substituted": sum(r["decision"]["substitute"] for r in mine),
            "measured_should_substitute": sum(r["truth"]["substitute"] for r in mine),
        }
    result = {
        "hardware_id": hardware_id,
        "device": "cpu (2 gloo ranks, 1 thread each)",
        "allocator": os.environ.get("GLIBC_TUNABLES", "glibc defaults"),
        "command": f"python benchmarks/substitution.py --tracking-uri URI --threshold {args.threshold:g} "
        f"--rounds {args.rounds}" + (" --refit" if args.refit else ""),
        "threshold": args.threshold,
        "overlap_costs_source": source,
        "overlap_costs": calibration.to_dict(),
        "decision_accuracy": sum(r["correct"] for r in results) / len(results),
        # what a policy that never substitutes would score: where fusion rarely pays, accuracy
        # alone says little, and this says how little
        "never_substitute_accuracy": sum(not r["truth"]["substitute"] for r in results) / len(results),
        "per_pair": per_pair,
        "substituted": len(substituted),
        "measured_gain_of_substituted": [r["measured_gain_of_choice"] for r in substituted],
        "points": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    by_pair = ", ".join(f"{p} {v['decision_accuracy']:.0%}" for p, v in per_pair.items())
    print(
        f"decision accuracy {result['decision_accuracy']:.0%} over {len(results)} points ({by_pair}; never "
        f"substituting would score {result['never_substitute_accuracy']:.0%}); "
        f"substituted {len(substituted)}, their measured gains "
        f"{', '.join(f'{g:+.1%}' for g in result['measured_gain_of_substituted']) or '-'}"
    )


if __name__ == "__main__":
    main()

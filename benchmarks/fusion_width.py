"""Fusion width (issue #9): serial vs fused throughput per reference workload, the policy's
width against the measured best, and a Tune sweep run fused vs unfused.

    .venv/bin/python benchmarks/fusion_width.py [--tracking-uri URI] [--max-width 64] [--rounds 5]
        [--parallel 1] [--trials 16]

1. The curves: with --tracking-uri, the champion bundle's of this hardware (what a calibration
   registered and `autotune --job sweep.yaml` chooses from), up to its widest measured width;
   for a workload it has none of (or without --tracking-uri), a probe: widths 1, 2, 4, ... up
   to the memory cap, the step-time cap or --max-width, each width in a fresh Ray worker
   process (`orchestrator.fusion`), then the throughput curve and the memory line fitted.
2. Policy: `policies.fusion_width.choose_width` under the memory cap.
3. Reality: every probed width and the chosen one measured again, --rounds rounds in rotated
   order (each in a fresh process), median per width. On CPU one width runs at a time
   (--parallel 1): the cores of one host share caches and memory bandwidth; with two at once,
   the same width measured up to 42% apart between two runs (the CNN at width 8). `chosen_vs_best` is the chosen width's
   measured throughput over the best measured width's; `speedup_vs_serial` the chosen
   width's over width 1's (B jobs run one after another go at width 1's rate).
4. Tune: --trials PointNet trials from one search space, run as fused groups of the chosen
   width and one model per trial, both timed end to end.
Writes benchmarks/results/fusion_width.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ray  # noqa: E402
from ray import tune  # noqa: E402

from orchestrator import ray_runtime  # noqa: E402
from orchestrator.cluster import cluster_fingerprint  # noqa: E402
from orchestrator.fusion import measure_width_task, probe_fusion  # noqa: E402
from orchestrator.fusion_tune import run_sweep, sample_trials  # noqa: E402
from orchestrator.measurement_store import MeasurementStore  # noqa: E402
from policies.fusion_width import choose_width  # noqa: E402
from predictors.fusion_model import fit_fusion_models  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402
from probes.workloads.fusion.models import WORKLOADS  # noqa: E402


def remeasure(workload: str, widths: list[int], rounds: int, parallel: int, max_seconds: float) -> dict[int, float]:
    """Median samples/s per width over `rounds` rounds, each round's widths in rotated order."""
    speeds: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(rounds):
        order = widths[r % len(widths) :] + widths[: r % len(widths)]
        pending: list = []
        for w in order:
            pending.append(
                (
                    w,
                    measure_width_task.options(num_cpus=1).remote(
                        workload, w, None, "adam", "cpu", max_seconds, 100 + r
                    ),
                )
            )
            if len(pending) >= parallel:
                w0, ref = pending.pop(0)
                speeds[w0].append(Measurement.from_row(ray.get(ref)).extra["samples_per_s"])
        for w0, ref in pending:
            speeds[w0].append(Measurement.from_row(ray.get(ref)).extra["samples_per_s"])
    return {w: float(np.median(v)) for w, v in speeds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--tracking-uri", help="take the curves from this store's champion bundle for this hardware")
    parser.add_argument("--max-width", type=int, default=64)
    parser.add_argument("--step-cap-s", type=float, default=1.5, help="stop widening past this step time")
    parser.add_argument("--probe-seconds", type=float, default=1.5, help="timed seconds per width")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="widths measured at once (CPU devices share caches and memory bandwidth: 1)",
    )
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=40)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/fusion_width.json"))
    args = parser.parse_args()

    ray_runtime.connect()
    fingerprint = cluster_fingerprint()
    devices = max(1, int(ray.cluster_resources().get("CPU", 1)))
    parallel = max(1, min(args.parallel, devices))
    memory_cap = 0.6 * fingerprint.min_device_memory_bytes  # as orchestrator.cli.fuse does by default
    print(
        f"hardware {fingerprint.hardware_id}: {devices} CPU device(s), {parallel} measured at once, memory cap "
        f"{memory_cap / 2**30:.1f} GiB per fused job",
        flush=True,
    )
    results: dict = {
        "hardware_id": fingerprint.hardware_id,
        "command": "python benchmarks/fusion_width.py " + " ".join(sys.argv[1:]),
        "memory_cap_bytes": memory_cap,
        "workloads": {},
    }
    registered: dict = {}
    if args.tracking_uri:
        from orchestrator import registry

        registry.configure(args.tracking_uri)
        champion = registry.get_alias(fingerprint.hardware_id, registry.CHAMPION)
        if champion is None:
            raise SystemExit(f"no champion for {fingerprint.hardware_id} in {args.tracking_uri}")
        registered = {w: m for w, m in champion.model.fusion.items() if w in args.workloads}
        results["bundle"] = f"{champion.name}/{champion.version}"
        print(f"curves of {sorted(registered)} from {results['bundle']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = MeasurementStore(Path(tmp) / "fusion")
        t0 = time.perf_counter()
        rows = probe_fusion(
            [w for w in args.workloads if w not in registered],
            store,
            args.max_width,
            memory_cap,
            args.step_cap_s,
            parallel=parallel,
            max_seconds=args.probe_seconds,
        )
        probe_s = time.perf_counter() - t0
        models = {**fit_fusion_models(rows), **registered}
        for name in args.workloads:
            model = models[name]
            widest = min(args.max_width, max(model.widths))  # as autotune's sweep: never past a measured width
            decision = choose_width(model, memory_cap, widest)
            chosen = decision.choice_detail["width"]
            probed = sorted(model.widths)
            widths = sorted(set(probed) | {chosen})
            measured = remeasure(name, widths, args.rounds, parallel, args.probe_seconds)
            best = max(measured, key=measured.get)
            entry = {
                "curve": "registered" if name in registered else "probed",
                "probed": {
                    int(r.params["width"]): {
                        "samples_per_s": r.extra["samples_per_s"],
                        "peak_memory_mb": r.extra["peak_memory_bytes"] / 2**20,
                    }
                    for r in rows
                    if r.params["workload"] == name
                },
                "model": model.to_dict(),
                "chosen_width": chosen,
                "predicted_samples_per_s": decision.choice_detail["samples_per_s"],
                "measured_samples_per_s": measured,
                "best_width": best,
                "chosen_vs_best": measured[chosen] / measured[best],
                "speedup_vs_serial": measured[chosen] / measured[1],
                "prediction_error": abs(decision.choice_detail["samples_per_s"] - measured[chosen]) / measured[chosen],
            }
            results["workloads"][name] = entry
            row = "  ".join(f"B={w}:{measured[w]:.0f}" for w in widths)
            print(f"{name:12s} {row}", flush=True)
            print(
                f"{'':12s} chosen B={chosen} predicted {entry['predicted_samples_per_s']:.0f}/s measured "
                f"{measured[chosen]:.0f}/s ({entry['prediction_error']:.1%} off); best measured B={best}; "
                f"chosen/best {entry['chosen_vs_best']:.3f}; vs serial {entry['speedup_vs_serial']:.2f}x",
                flush=True,
            )
        results["probe_wall_s"] = probe_s

        space = {
            "lr": tune.loguniform(1e-4, 1e-2),
            "weight_decay": tune.loguniform(1e-6, 1e-3),
            "dropout": tune.uniform(0.0, 0.3),
            "beta1": tune.uniform(0.85, 0.95),
            "seed": tune.randint(0, 10000),
            "batch_size": 32,
            "optimizer": "adam",
        }
        trials = sample_trials(space, args.trials, seed=0)
        width = min(results["workloads"].get("pointnet", {}).get("chosen_width", 8), args.trials)
        sweeps = {}
        for fused in (True, False):
            outcome = run_sweep(
                "pointnet",
                trials,
                width,
                args.epochs,
                args.steps_per_epoch,
                Path(tmp) / "tune",
                f"{'fused' if fused else 'unfused'}",
                fused=fused,
            )
            best = outcome.best()
            sweeps["fused" if fused else "unfused"] = {
                "wall_s": outcome.wall_s,
                "tune_trials": len(outcome.groups),
                "trials": len(outcome.trials),
                "best_trial": best.trial_id,
                "best_val_loss": best.final["val_loss"],
                "best_val_accuracy": best.final["val_accuracy"],
            }
            print(
                f"tune sweep {'fused' if fused else 'unfused'}: {len(outcome.trials)} trials in "
                f"{len(outcome.groups)} Tune trial(s), {outcome.wall_s:.1f}s; best {best.trial_id} "
                f"val_loss {best.final['val_loss']:.3f} acc {best.final['val_accuracy']:.2f}",
                flush=True,
            )
        sweeps["fusion_width"] = width
        sweeps["speedup"] = sweeps["unfused"]["wall_s"] / sweeps["fused"]["wall_s"]
        results["tune_sweep"] = sweeps
        print(
            f"tune sweep of {args.trials} PointNet trials: fused (B<={width}) {sweeps['fused']['wall_s']:.1f}s vs "
            f"unfused {sweeps['unfused']['wall_s']:.1f}s ({sweeps['speedup']:.2f}x)"
        )
    ray_runtime.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""How a DLRM step's measured time grows with its simulated kernels, by kind of training probe
and batch: does the step model's lean sit in a fixed per-step cost or in the kernels' scale?

    .venv/bin/python benchmarks/step_slope.py --tracking-uri URI CALIBRATION_DIR [CALIBRATION_DIR ...]

Every stored `dlrm_step` of the given calibration directories (the champion's own and, say,
the earlier ones it pooled) is priced by the champion registered at URI twice: its kernels
alone (the simulated graph, no step overhead) and whole. Per probe kind (task, light,
overhead) the script prints a least-squares line of measured time over the kernels' (free
of the step overhead's non-negative coefficients), and per batch the measured / kernels
ratio, what the step leaves over its kernels and the whole prediction's mean signed error.
Writes benchmarks/results/step_slope.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from predictors.dlrm_estimator import estimate_step  # noqa: E402
from probes.training import job_kind  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("calibrations", type=Path, nargs="+", help="calibration directories (measurements.jsonl)")
    parser.add_argument("--tracking-uri", required=True, help="the store whose champion prices the steps")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_slope.json"))
    args = parser.parse_args()
    for directory in args.calibrations:
        if not (directory / "fingerprint.json").is_file():
            parser.error(f"{directory}: not a calibration directory (no fingerprint.json)")

    from orchestrator import registry
    from orchestrator.measurement_store import MeasurementStore

    registry.configure(args.tracking_uri)
    hardware_id = json.loads((args.calibrations[0] / "fingerprint.json").read_text())["hardware_id"]
    model = registry.load_performance_model(args.tracking_uri, hardware_id)
    steps = []
    for directory in args.calibrations:
        for row in MeasurementStore(directory).rows():
            if row.op == DLRM_STEP_OP:
                steps.append(
                    {
                        "calibration": directory.name,
                        "kind": job_kind(row.params["job"]["name"]),
                        "batch_size": int(row.params["job"]["batch_size"]),
                        "measured_ms": row.median_s * 1e3,
                        "kernels_ms": estimate_step(model, row, False, True).iteration_s * 1e3,
                        "predicted_ms": estimate_step(model, row, True, True).iteration_s * 1e3,
                    }
                )
    kinds = {}
    for kind in dict.fromkeys(s["kind"] for s in steps):
        group = [s for s in steps if s["kind"] == kind]
        kernels = np.array([s["kernels_ms"] for s in group])
        measured = np.array([s["measured_ms"] for s in group])
        (fixed, scale), *_ = np.linalg.lstsq(np.vstack([np.ones_like(kernels), kernels]).T, measured, rcond=None)
        batches = {}
        print(f"{kind:9s} n={len(group):3d}: measured = {fixed:.2f} ms + {scale:.3f} x kernels (least squares)")
        for batch in sorted({s["batch_size"] for s in group}):
            at = [s for s in group if s["batch_size"] == batch]
            batches[batch] = {
                "n": len(at),
                "measured_over_kernels": float(np.mean([s["measured_ms"] / s["kernels_ms"] for s in at])),
                "left_over_kernels_ms": float(np.mean([s["measured_ms"] - s["kernels_ms"] for s in at])),
                "mean_signed_error": float(
                    np.mean([(s["predicted_ms"] - s["measured_ms"]) / s["measured_ms"] for s in at])
                ),
                "mean_measured_ms": float(np.mean([s["measured_ms"] for s in at])),
            }
            b = batches[batch]
            print(
                f"  batch {batch:5d} n={b['n']:2d}: measured / kernels {b['measured_over_kernels']:.2f}, "
                f"{b['left_over_kernels_ms']:6.2f} ms over the kernels, predicted {b['mean_signed_error']:+.1%} "
                f"(mean step {b['mean_measured_ms']:.1f} ms)"
            )
        kinds[kind] = {"n": len(group), "fixed_ms": float(fixed), "kernel_scale": float(scale), "by_batch": batches}
    command = "python benchmarks/step_slope.py --tracking-uri URI " + " ".join(str(d) for d in args.calibrations)
    print(
        f"wrote {write_result(args.out, {'command': command, 'hardware_id': hardware_id, 'kinds': kinds, 'steps': steps})}"
    )


if __name__ == "__main__":
    main()

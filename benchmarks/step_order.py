"""A calibration's whole steps in the order it timed them, priced by its champion: did the host
drift while the calibration measured?

    .venv/bin/python benchmarks/step_order.py --tracking-uri URI --calibration-dir DIR

A calibration interleaves its training probes with the kernel sweep over its measuring phase
(ten minutes at `--budget-s 600`), and each workload's step overhead is fitted over all of its
steps at once. If the host ran two-rank steps faster as the phase went on, the champion prices
the early steps low and the late ones high, and a run timed after the calibration meets the
late state (#26, 11-29 20:22). Per workload: every step in stored order (the store appends rows
as they are measured) with the champion's signed error, and the mean signed error of each half.
Reads stored rows only; nothing is timed. Writes benchmarks/results/step_order.json (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from benchmarks.step_checks import OWN_STEPS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", required=True, help="where the calibration registered its champion")
    parser.add_argument("--calibration-dir", type=Path, required=True, help="its directory (measurements.jsonl)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_order.json"))
    args = parser.parse_args()
    if not (args.calibration_dir / "fingerprint.json").is_file():
        parser.error(f"--calibration-dir: {args.calibration_dir} is not a calibration directory (no fingerprint.json)")

    from orchestrator import registry

    hardware_id = json.loads((args.calibration_dir / "fingerprint.json").read_text())["hardware_id"]
    model = registry.load_performance_model(args.tracking_uri, hardware_id)
    rows = read_rows(args.calibration_dir / "measurements.jsonl")
    result: dict = {"command": "python benchmarks/step_order.py --tracking-uri URI --calibration-dir DIR"}
    result["calibration_dir"] = str(args.calibration_dir)
    for workload, kind in OWN_STEPS.items():
        steps = []
        timed = [r for r in rows if r.op == kind.op]
        # a step timed again after a failure is stored twice: its last row, where it was timed last
        last = {kind.name(r): i for i, r in enumerate(timed)}
        for row in (r for i, r in enumerate(timed) if last[kind.name(r)] == i):
            predicted = kind.price_s(model, row)
            steps.append(
                {
                    "name": kind.name(row),
                    "like_tasks": kind.like_tasks(row),
                    "stored_ms": row.median_s * 1e3,
                    "predicted_ms": predicted * 1e3,
                    "error": (predicted - row.median_s) / row.median_s,
                }
            )
        if not steps:
            continue
        half = len(steps) // 2
        halves = {
            "first_half_signed": statistics.fmean(s["error"] for s in steps[:half]) if half else None,
            "second_half_signed": statistics.fmean(s["error"] for s in steps[half:]),
        }
        result[workload] = {"steps": steps, **halves}
        print(
            f"{workload}: {len(steps)} steps in the order timed: "
            + " ".join(f"{s['name']} {s['error']:+.0%}" for s in steps)
        )
        first = halves["first_half_signed"]
        print(
            f"{workload}: champion's mean signed error, first half "
            + ("-" if first is None else f"{first:+.1%}")
            + f", second half {halves['second_half_signed']:+.1%}"
        )
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

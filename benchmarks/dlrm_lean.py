"""Where the DLRM prediction's lean sits across every stored e2e run: per batch size, how far
predicted steps fall short of measured ones, as a share and in milliseconds.

    python benchmarks/dlrm_lean.py [FILES...]

FILES: `benchmarks/e2e_accuracy.py` results, full-size ones only (default: every `dlrm_<stamp>.json`
under `benchmarks/results/e2e_issue26_*/`). A lean that is the same share at every batch is a
price off by a factor (a kernel model, an in-step factor); one that is the same number of
milliseconds at every batch is time per step that no batch-dependent kernel carries (the
framework, the harness, the host), and it weighs most on the shortest steps. Also the host
checks' speed beside each run (`--host-check`: under 1 the host ran slower than at its
calibration). Reads stored figures only; nothing is measured.

Writes benchmarks/results/dlrm_lean.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.issue26_tally import STAMP  # noqa: E402

OUT = REPO / "benchmarks/results/dlrm_lean.json"


def stored_runs() -> list[Path]:
    """Every DLRM run of the e2e cycles (a stamp's result, not its reruns: the tally's names)."""
    return sorted(
        p
        for p in REPO.glob("benchmarks/results/e2e_issue26_*/dlrm_*.json")
        if (m := STAMP.match(p.name)) and m.group(1) == "dlrm"
    )


def lean_by_batch(paths: list[Path]) -> dict:
    """Per batch size: tasks, median measured step, mean signed error, and the mean and median
    of predicted - measured in ms; and a line through all tasks' misses against their
    measured step (ms = a + b * measured_ms: a constant miss has b near 0)."""
    by_batch: dict[int, list[tuple[float, float]]] = defaultdict(list)
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        if data.get("scale", 1.0) != 1.0:  # a down-scaled run's tasks are not the jobs users run
            continue
        for task in data["tasks"]:
            by_batch[int(task["batch_size"])].append((task["measured_ms"], task["predicted_ms"]))
        speeds = list((data.get("host_speed") or {}).values())
        runs.append(
            {
                "file": str(path.relative_to(REPO)),
                "mean_signed_error": data["mean_signed_error"],
                "host_speed_mean": statistics.fmean(speeds) if speeds else None,
            }
        )
    batches = {}
    for batch, pairs in sorted(by_batch.items()):
        measured, predicted = (np.array(x) for x in zip(*pairs))
        miss = predicted - measured
        batches[batch] = {
            "tasks": len(pairs),
            "measured_ms_median": float(np.median(measured)),
            "signed_mean": float(np.mean(miss / measured)),
            "miss_ms_mean": float(np.mean(miss)),
            "miss_ms_median": float(np.median(miss)),
        }
    pairs = [p for ps in by_batch.values() for p in ps]
    measured, predicted = (np.array(x) for x in zip(*pairs))
    intercept, slope = np.linalg.lstsq(
        np.column_stack([np.ones(len(pairs)), measured]), predicted - measured, rcond=None
    )[0]
    return {"runs": runs, "by_batch": batches, "miss_line": {"ms": float(intercept), "per_measured_ms": float(slope)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    paths = [p.resolve() for p in args.files] or stored_runs()
    if not paths:
        sys.exit("no stored DLRM runs found")
    result = lean_by_batch(paths)
    for batch, row in result["by_batch"].items():
        print(
            f"batch {batch:5d}: {row['tasks']:3d} tasks, measured median {row['measured_ms_median']:6.1f} ms, "
            f"signed {row['signed_mean']:+6.1%}, predicted - measured {row['miss_ms_mean']:+.2f} ms "
            f"(median {row['miss_ms_median']:+.2f})"
        )
    line = result["miss_line"]
    print(f"predicted - measured = {line['ms']:+.2f} ms {line['per_measured_ms']:+.3f} x measured, over all tasks")
    speeds = [r["host_speed_mean"] for r in result["runs"] if r["host_speed_mean"] is not None]
    if speeds:
        print(
            f"host speed at the runs against their calibration: mean {statistics.fmean(speeds):.3f} over {len(speeds)} runs"
        )
    command = "python benchmarks/dlrm_lean.py " + " ".join(map(str, args.files))
    Path(args.out).write_text(json.dumps({"command": command.strip(), **result}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

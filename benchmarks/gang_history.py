"""The same training steps timed on a gang with a calibration's history and on fresh gangs, side
by side: does the calibration time its steps faster than a job's fresh processes run them?

    .venv/bin/python benchmarks/gang_history.py --calibration-dir DIR [--history-s 60] [--rounds 3]

A calibration times its training probes on probe actors that have already run its collective
phase and the training probes before them; a launched job (and `benchmarks/step_drift.py`,
`benchmarks/launch_vs_probe.py`) runs in processes that have run nothing else. `step_drift.py`
found the calibration's own steps 1.055x slower re-timed on fresh gangs an hour later, while
the kernel host check saw 0.98-1.00. This separates the gang's history from the hour: one
pool first runs the calibration's collective sweep for `--history-s` seconds, then times each
of the calibration's table-wise task steps (`step_drift.calibration_steps`) on one long-lived
gang (the "aged" arm, as the calibration's training phase does); each step is also timed on a
fresh pool and gang (`launch_vs_probe.probe_step_ms`, the "fresh" arm). In every round each
step is timed once each way, the order alternating by round, so host drift falls on both.
Reports per step the median of each arm and their ratio (fresh / aged), and over steps the
geomean ratio with its 95% interval over the steps (`predictors.evaluation.error_stats`). Writes
benchmarks/results/gang_history.json (or `--out`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.launch_vs_probe import gang_step_s, probe_step_ms  # noqa: E402
from benchmarks.step_drift import calibration_steps  # noqa: E402
from orchestrator import ray_runtime  # noqa: E402
from orchestrator.cluster import cluster_fingerprint  # noqa: E402
from orchestrator.fanout import Phase, run_collective_probes  # noqa: E402
from orchestrator.measurement_store import MeasurementStore  # noqa: E402
from orchestrator.probe_pool import ActorPool, Gang  # noqa: E402
from predictors.evaluation import error_stats  # noqa: E402
from probes.collective_sweep import collective_groups, collective_specs  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402


def summarize(rows: list[dict], pairs: list[float]) -> dict:
    """Over the steps: each ratio's geomean with its 95% interval (a ratio's geomean is the
    GMAE of `error_stats`, whose interval is a t-interval on the mean log), and the pairs."""
    out: dict = {"pairs_above_1": sum(p > 1 for p in pairs), "pairs": len(pairs)}
    for key in ("fresh_over_aged", "aged_over_stored"):
        stats = error_stats(np.asarray([r[key] for r in rows]))
        out[f"{key}_geomean"], out[f"{key}_interval95"] = stats.gmae, [stats.gmae_low, stats.gmae_high]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration-dir", type=Path, required=True, help="a calibration's directory")
    parser.add_argument("--history-s", type=float, default=60.0, help="seconds of collective sweep before the steps")
    parser.add_argument("--rounds", type=int, default=3, help="times each step is timed each way")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gang_history.json"))
    args = parser.parse_args()
    if not (args.calibration_dir / "measurements.jsonl").is_file():
        parser.error(f"--calibration-dir: no measurements.jsonl in {args.calibration_dir}")
    if args.rounds < 1 or args.history_s < 0:
        parser.error(f"--rounds >= 1 and --history-s >= 0 expected, got {args.rounds} and {args.history_s}")
    steps = calibration_steps(args.calibration_dir)
    if not steps:
        parser.error(f"--calibration-dir: {args.calibration_dir} has no table-wise task-shaped DLRM steps")
    world = int(steps[0]["job"]["world_size"])
    ray_runtime.connect(num_cpus=2 * world)  # the aged pool idles while a fresh one runs
    hardware_id = cluster_fingerprint().hardware_id
    aged = ActorPool("cpu", hardware_id, world).start()
    times: dict[str, list[list[float]]] = {"aged": [[] for _ in steps], "fresh": [[] for _ in steps]}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            gang = Gang(aged)
            specs = collective_specs(collective_groups(gang.nodes), aged.max_collective_bytes())
            t0 = time.monotonic()
            done, _ = run_collective_probes(Phase(aged, specs, MeasurementStore(Path(scratch)), t0 + args.history_s))
            print(f"history: {done} collective points in {time.monotonic() - t0:.0f} s", flush=True)
        gang = Gang(aged)
        gang.form()

        for k in range(args.rounds):
            for i, step in enumerate(steps):
                params = {"job": step["job"], "table_to_rank": step["plan"]}
                for arm in ("aged", "fresh") if (k + i) % 2 == 0 else ("fresh", "aged"):
                    ms = (
                        gang_step_s(gang, params, DLRM_STEP_OP) * 1e3
                        if arm == "aged"
                        else probe_step_ms(hardware_id, world, params, DLRM_STEP_OP)
                    )
                    times[arm][i].append(ms)
                    print(f"round {k + 1}/{args.rounds} {step['job']['name']:9s} {arm:5s} {ms:7.2f} ms", flush=True)
        gang.disband()
    finally:
        aged.stop()
        ray_runtime.shutdown()
    rows = []
    for i, step in enumerate(steps):
        a, f = statistics.median(times["aged"][i]), statistics.median(times["fresh"][i])
        rows.append(
            {
                "job": step["job"]["name"],
                "batch": step["job"]["batch_size"],
                "stored_ms": step["stored_ms"],
                "aged_ms": times["aged"][i],
                "fresh_ms": times["fresh"][i],
                "fresh_over_aged": f / a,
                "aged_over_stored": a / step["stored_ms"],
            }
        )
        print(
            f"{rows[-1]['job']:9s} stored {step['stored_ms']:7.2f}  aged {a:7.2f}  fresh {f:7.2f}  fresh/aged {f / a:.3f}"
        )
    pairs = [f / a for i in range(len(steps)) for a, f in zip(times["aged"][i], times["fresh"][i])]
    summary = summarize(rows, pairs)
    for key, label in (("fresh_over_aged", "fresh / aged"), ("aged_over_stored", "aged / stored")):
        low, high = summary[f"{key}_interval95"]
        print(f"{label}: geomean {summary[f'{key}_geomean']:.3f} [95% {low:.3f}, {high:.3f}] over {len(rows)} steps")
    print(f"{summary['pairs_above_1']} of {summary['pairs']} fresh / aged pairs above 1")
    result = {
        "hardware_id": hardware_id,
        "command": f"python benchmarks/gang_history.py --calibration-dir DIR --history-s {args.history_s:g} "
        f"--rounds {args.rounds}",
        "calibration_dir": str(args.calibration_dir),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "steps": rows,
        "summary": summary,
    }
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

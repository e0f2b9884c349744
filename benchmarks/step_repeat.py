"""A calibration's DLRM steps timed again in rounds, and its step model refitted on them: is a
run's lean the noise of the single timing each step row had?

    .venv/bin/python benchmarks/step_repeat.py MEASUREMENTS [--rounds 3] [--base-cache DIR]
        [--also-dlrm RUN.json] [--timed EARLIER.json]

MEASUREMENTS: one stored calibration (`measurements_T.jsonl[.gz]`, its cycle's `dlrm_T.json`
and `transformer_T.json` beside it, as `benchmarks/pooled_steps.py` takes them). A calibration
times each training step once (30 steps' median, in one go); a step of a few milliseconds
on a shared host moves by tens of percent from one minute to the next, and the step overhead
is fitted on 24 such rows. Here every `dlrm_step` row's job and plan is timed `--rounds`
times more, one probe gang for all (as the calibration's training phase times them; a fresh
gang per step times them alike: `benchmarks/gang_history.py`), the order reversed every
round so drift within the run falls on every step. The timings are written out first; then
the calibration's bundle without its steps (`--base-cache`, as `benchmarks/kernel_class_split.py`
keeps it) gets its step overheads fitted three ways: on the rows as stored, on the median of
the new timings, and on the median of both. Each is scored on its own steps left out in turn
and on the cycle's e2e jobs re-priced (`--also-dlrm`: another run of the same jobs, e.g. the
DLRM benchmark rerun with the cycle's `--seed`). Earlier calibrations are not pooled (a
cycle in a fresh store has none). `--timed` takes an earlier run's timings instead of
measuring. Writes benchmarks/results/step_repeat.json (or `--out`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.kernel_class_split import base_state  # noqa: E402
from benchmarks.launch_vs_probe import formed_gang, gang_step_s  # noqa: E402
from benchmarks.pooled_steps import cycle_files, judged, line, with_history  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.step_fit import STEP_OP_OF  # noqa: E402
from probes.training import job_kind  # noqa: E402
from probes.vocabulary.ops import DLRM_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402


def step_name(row: Measurement) -> str:
    """A calibration's training probe job is named by its kind and index (task1, light2, ...)."""
    return str(row.params["job"]["name"])


def time_steps(steps: list[Measurement], rounds: int) -> dict[str, list[float]]:
    """Every step's job and plan timed `rounds` times on one probe gang, in alternating order."""
    from orchestrator import ray_runtime
    from orchestrator.cluster import cluster_fingerprint

    ray_runtime.connect()
    times: dict[str, list[float]] = {step_name(s): [] for s in steps}
    try:
        with formed_gang("cpu", cluster_fingerprint().hardware_id, steps[0].world_size) as gang:
            for k in range(rounds):
                for step in steps if k % 2 == 0 else steps[::-1]:
                    params = {"job": step.params["job"], "table_to_rank": step.params["table_to_rank"]}
                    seconds = gang_step_s(gang, params, DLRM_STEP_OP)
                    times[step_name(step)].append(seconds)
                    print(
                        f"round {k + 1}/{rounds} {step_name(step):12s} stored {step.median_s * 1e3:7.2f} ms, "
                        f"now {seconds * 1e3:7.2f} ms",
                        flush=True,
                    )
    finally:
        ray_runtime.shutdown()
    return times


def ratio_summary(steps: list[Measurement], times: dict[str, list[float]]) -> dict[str, dict]:
    """Per kind of step (task, light, overhead): the geomean of median-now / stored, and the
    largest spread of a step's own timings ((max - min) / median)."""
    out: dict[str, dict] = {}
    for kind in sorted({job_kind(step_name(s)) for s in steps}):
        mine = [s for s in steps if job_kind(step_name(s)) == kind]
        ratios = np.array([np.median(times[step_name(s)]) / s.median_s for s in mine])
        spreads = [(max(t) - min(t)) / float(np.median(t)) for t in (times[step_name(s)] for s in mine)]
        out[kind] = {
            "steps": len(mine),
            "now_over_stored_geomean": float(np.exp(np.mean(np.log(ratios)))),
            "now_over_stored_min": float(ratios.min()),
            "now_over_stored_max": float(ratios.max()),
            "spread_max": float(max(spreads)),
        }
    return out


def retimed(rows: list[Measurement], times: dict[str, list[float]], keep_stored: bool) -> list[Measurement]:
    """The rows with every DLRM step's time the median of its new timings (and of its stored
    one, `keep_stored`)."""
    out = []
    for r in rows:
        if r.op == DLRM_STEP_OP and step_name(r) in times:
            t = times[step_name(r)] + ([r.median_s] if keep_stored else [])
            r = dataclasses.replace(r, median_s=float(np.median(t)))
        out.append(r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("measurements", type=Path, help="one stored calibration's rows")
    parser.add_argument("--rounds", type=int, default=3, help="times each step is timed again")
    parser.add_argument("--base-cache", type=Path, help="keep (and reuse) the bundle fitted without steps here")
    parser.add_argument("--also-dlrm", type=Path, help="another run of the cycle's DLRM jobs to re-price")
    parser.add_argument("--timed", type=Path, help="an earlier run's JSON: its timings, instead of measuring")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "step_repeat.json"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    files = cycle_files(args.measurements)
    rows = read_rows(args.measurements)
    # one per job (a step row retried after a failure is the same job timed again)
    steps = list({step_name(r): r for r in rows if r.op == DLRM_STEP_OP}.values())
    if not steps:
        parser.error(f"{args.measurements}: no {DLRM_STEP_OP} rows")
    command = f"python benchmarks/step_repeat.py {args.measurements.name} " + (
        f"--timed {args.timed.name}" if args.timed is not None else f"--rounds {args.rounds}"
    )
    if args.also_dlrm is not None:
        command += f" --also-dlrm {args.also_dlrm.name}"
    if args.timed is not None:
        times = json.loads(args.timed.read_text())["times_s"]
        missing = sorted({step_name(s) for s in steps} - set(times))
        if missing:
            parser.error(f"--timed {args.timed}: no timings for steps {', '.join(missing)}")
    else:
        times = time_steps(steps, args.rounds)
    result: dict = {"command": command, "times_s": times, "by_kind": ratio_summary(steps, times)}
    print(f"timings: {write_result(args.out, result)}", flush=True)  # before the fits, which can fail
    for kind, s in result["by_kind"].items():
        print(
            f"{kind:9s} ({s['steps']:2d} steps): now / stored geomean {s['now_over_stored_geomean']:.3f} "
            f"[{s['now_over_stored_min']:.2f}, {s['now_over_stored_max']:.2f}], a step's own timings "
            f"up to {s['spread_max']:.0%} apart"
        )

    base = base_state(rows, args.measurements.name.split(".")[0], args.base_cache)
    also: dict[str, Path | None] | None = None
    if args.also_dlrm is not None:
        also = {**files, "dlrm": args.also_dlrm, "transformer": None}
    variants = {
        "as stored": rows,
        "median of the new": retimed(rows, times, keep_stored=False),
        "median with stored": retimed(rows, times, keep_stored=True),
    }
    result["variants"] = []
    for label, variant_rows in variants.items():
        model = with_history(base, variant_rows, None)
        steps_gmae = {w: model.metrics[op]["gmae"] for w, op in STEP_OP_OF.items() if op in model.metrics}
        scores = judged(model, files)
        entry = {"variant": label, "steps_gmae": steps_gmae, **scores}
        print(f"{line(label, scores)}  steps left out in turn: DLRM {steps_gmae.get('dlrm', float('nan')):.1%}")
        if also is not None:
            entry["also_dlrm"] = judged(model, also)["dlrm"]
            print(line(f"  {args.also_dlrm.name}", {"dlrm": entry["also_dlrm"]}))
        result["variants"].append(entry)
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

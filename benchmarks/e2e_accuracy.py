"""Whole-iteration accuracy of the critical-path simulator on random DLRM tasks run for real.

    .venv/bin/python benchmarks/e2e_accuracy.py [--tasks 12] [--budget-s 300] [--tracking-uri URI] [--seed S] [--rounds 2]
        [--host-check CALIBRATION_DIR] [--step-checks 4]

Calibrates this machine (generic sweep, no knowledge of the tasks) into a scratch MLflow store,
or uses the champion already registered under `--tracking-uri`. Then draws random DLRM tasks
the anchor's way (probes/workloads/random_dlrm.py), places each task's tables with one of the
sharders (cycling through all of them, so plans vary), runs each for real through the same Ray
Train launcher as `orchestrator.cli.run` (2 ranks, gloo on CPU) and predicts it three ways:
- `predicted`: the simulator over the task's execution graph plus the fitted step overhead
  (what the policies use);
- `sum+overhead`: kernels summed without synchronisation, plus the same overhead;
- `baseline`: the plain sum of kernel times (the anchor's baseline).
Tasks are drawn from `--seed` (default: a fresh one, printed and recorded, so a figure is not
one seed stream's) at full size (`--scale` 1) unless the host cannot hold a task's tables, then
at the largest halving that fits. The signed error is reported beside the absolute one. Each
task is launched `--rounds` times (default 2, odd rounds in reverse order): its measured time is
the median, and how far its launches disagree, the host's noise floor, is reported beside the
errors, and the host's speed against the calibration's (`--host-check`) is measured before the
first round and after each; with it, a few of that calibration's own table-wise task steps are
timed again at each check and priced by the champion (`--step-checks`, benchmarks/step_checks.py):
the champion's signed error on its own steps now is the host's spell, what the tasks lean beyond
it is the jobs'. Prints a row per task and writes benchmarks/results/e2e_accuracy_dlrm.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from orchestrator import ray_runtime, registry  # noqa: E402
from orchestrator.cluster import cluster_fingerprint  # noqa: E402
from orchestrator.launch import LaunchResult, launch_dlrm  # noqa: E402
from orchestrator.quiet_host import QuietWait, wait_for_quiet_host  # noqa: E402
from policies.sharders import SHARDERS, rank_memory  # noqa: E402
from predictors.dlrm_estimator import estimate_iteration  # noqa: E402
from predictors.evaluation import error_stats, mean_interval  # noqa: E402
from probes.workloads.random_dlrm import fitting_scale, random_dlrm_tasks  # noqa: E402

MEMORY_CAP_BYTES = 4 * 2**30


def calibrate_into(scratch: Path, budget_s: float, seed: int) -> str:
    """Run the calibration CLI (its own Ray) into a sqlite store in `scratch`; return the URI."""
    uri = f"sqlite:///{scratch / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli.calibrate",
        "--budget-s",
        str(budget_s),
        "--seed",
        str(seed),
        "--tracking-uri",
        uri,
    ]
    print(f"calibrating ({budget_s:g}s budget): {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=scratch, env=env, check=True)
    return uri


def champion_on_ray(scratch: Path, tracking_uri: str | None, budget_s: float, seed: int):
    """Calibrate into `scratch` unless a tracking URI is given; connect Ray; load the champion."""
    uri = tracking_uri or calibrate_into(scratch, budget_s, seed)
    registry.configure(uri)
    ray_runtime.connect()
    fingerprint = cluster_fingerprint()
    model = registry.load_performance_model(uri, fingerprint.hardware_id)
    print(f"model for {fingerprint.hardware_id}: ops {sorted(model.models)}", flush=True)
    return fingerprint, model


def task_plan(i: int, spec, seed: int) -> tuple[str, list]:
    """Task `i`'s sharder (the sharders in turn, so plans vary) and that sharder's plan."""
    sharder = list(SHARDERS)[i % len(SHARDERS)]
    return sharder, SHARDERS[sharder](spec.tables, spec.world_size, MEMORY_CAP_BYTES, seed=seed)


def geomean(errors: list[float]) -> float:
    return math.exp(sum(math.log(max(e, 1e-6)) for e in errors) / len(errors))


def add_dlrm_task_arguments(parser: argparse.ArgumentParser, tasks: int) -> None:
    """The options of a benchmark over random DLRM tasks priced by a champion: how many tasks,
    their world size and scale, and where the champion comes from."""
    parser.add_argument("--tasks", type=int, default=tasks)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help="shrink table rows (and pooling) by this; default: full size, halved while the host cannot hold a task",
    )
    parser.add_argument("--budget-s", type=float, default=300, help="calibration budget when no --tracking-uri")
    parser.add_argument("--tracking-uri", help="use the champion registered here instead of calibrating")


def draw_tasks(args: argparse.Namespace) -> list:
    """The benchmark's tasks: `args.seed` (a fresh one when not given) and `args.scale` (see
    `fitting_scale`, the host's memory shared by all ranks, when not given), both written back into `args` for the record."""
    if args.seed is None:
        args.seed = secrets.randbelow(2**31)
    if args.scale is None:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        args.scale = fitting_scale(range(args.tasks), args.world_size, args.seed, host)
    print(f"tasks: {args.tasks} drawn with --seed {args.seed} at --scale {args.scale:g}", flush=True)
    return random_dlrm_tasks(args.tasks, args.world_size, args.seed, args.scale)


def signed_errors(rows: list[dict]) -> np.ndarray:
    """Each task's (predicted - measured) / measured: below 0 when the model leans low."""
    return np.array([(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rows])


def tasks_by_batch(rows: list[dict]) -> dict[int, list[dict]]:
    """A DLRM run's tasks by batch size, in order of size (empty for a transformer's tasks)."""
    out: dict[int, list[dict]] = {}
    for r in rows:
        if "batch_size" in r:
            out.setdefault(int(r["batch_size"]), []).append(r)
    return dict(sorted(out.items()))


def signed_error(rows: list[dict]) -> float:
    """Their mean."""
    return float(signed_errors(rows).mean())


def signed_summary(rows: list[dict]) -> dict:
    """The mean signed error with its 95% t-interval over the tasks (None for one task): a
    dozen jobs cannot place a lean more finely than that, so a bar is read against it."""
    signed = signed_errors(rows)
    interval = list(mean_interval(signed)) if len(signed) >= 2 else None
    return {"mean_signed_error": float(signed.mean()), "mean_signed_interval": interval}


def error_summary(errors: list[float]) -> dict:
    """The geomean error with its 95% interval and count (`predictors.evaluation.error_stats`)
    and its spread (see `spread`), as a result's keys."""
    stats = error_stats(np.asarray(errors, dtype=np.float64))
    interval = None if stats.gmae_low is None else [stats.gmae_low, stats.gmae_high]
    return {"geomean_error": geomean(errors), "geomean_interval": interval, "count": len(errors), **spread(errors)}


def interval_text(interval: list[float] | None, signed: bool = False) -> str:
    """' [low, high]' of a 95% interval, or nothing when there is none."""
    if interval is None:
        return ""
    fmt = "{:+.1%}" if signed else "{:.1%}"
    return " [" + ", ".join(fmt.format(v) for v in interval) + "]"


def write_result(path: str, result: dict) -> Path:
    """Write a benchmark's result JSON to `path` (making its folder); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return out


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_rounds_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds",
        type=_at_least_one,
        default=2,
        help="launch every task this many times, in rounds (default 2): its measured time is the median, and "
        "how far a task's launches disagree is the host's noise floor, reported beside the errors",
    )


def measure_in_rounds(
    names: list[str], rounds: int, launch: Callable[[int], float], between: Callable[[str], None] | None = None
) -> list[list[float]]:
    """Every task's measured ms in every round (`launch(i)` runs task i once). Odd rounds run
    the tasks in reverse, so a host's drift over the run falls on early and late tasks alike.
    `between(label)` runs before the first round and after each (the host speed checks).
    On a shared host one job launched twice has measured 1.5x apart (two identical transformer
    tasks, 124 and 190 ms, in one run of 2026-11-25): a single launch cannot tell a model's
    error from the host's, and the repeats say how large the host's is."""
    times: list[list[float]] = [[] for _ in names]
    if between is not None:
        between("before round 1")
    for r in range(rounds):
        for i in range(len(names)) if r % 2 == 0 else range(len(names) - 1, -1, -1):
            times[i].append(launch(i))
            print(f"  round {r + 1}/{rounds} {names[i]:10s} measured {times[i][-1]:8.2f} ms", flush=True)
        if between is not None:
            between(f"after round {r + 1}")
    return times


class LaunchLog:
    """Each task's launches as `measure_in_rounds` runs them: it times their iteration ms, and
    this keeps beside each the share of the host's cores other processes kept busy while its
    steps were timed (`LaunchResult.host_other_share`), so a run's lean can be read against the
    load its jobs ran beside rather than only the kernel checks' single-rank speed."""

    def __init__(self, count: int):
        self.other_shares: list[list[float | None]] = [[] for _ in range(count)]
        self.ended_unix: list[list[float]] = [[] for _ in range(count)]

    def timed(self, i: int, result: LaunchResult) -> float:
        """Also the wall-clock second each launch ended, so its time can be set beside a host
        sampler's series (benchmarks/host_canary.py) taken over the same run."""
        self.other_shares[i].append(result.host_other_share)
        self.ended_unix[i].append(round(time.time(), 1))
        return result.iteration_ms

    def result(self) -> dict[str, float | None]:
        """The median and max share over every launch that reported one (None: none did)."""
        shares = [s for task in self.other_shares for s in task if s is not None]
        if not shares:
            return {"host_other_share_median": None, "host_other_share_max": None}
        return {"host_other_share_median": statistics.median(shares), "host_other_share_max": max(shares)}


def add_host_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host-check",
        type=Path,
        default=None,
        help="a calibration directory whose kernel points are measured again before the first round and after "
        "each (benchmarks/host_drift.py), so the figures carry the host's speed against the calibration's; "
        "default: the calibration this run makes (none with --tracking-uri)",
    )
    parser.add_argument("--host-check-points", type=_at_least_one, default=40, help="kernel points per check")
    parser.add_argument(
        "--step-checks",
        type=int,
        default=4,
        help="steps of that calibration like the run's tasks timed again at each check and priced by the "
        "champion (benchmarks/step_checks.py), so the run's lean can be read against the host's spell; 0: none",
    )


def check_host_check_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a --host-check that is not a calibration directory before anything is launched."""
    if args.host_check is not None and not (args.host_check / "measurements.jsonl").is_file():
        parser.error(f"--host-check: no measurements.jsonl in {args.host_check} (expected a calibration's directory)")
    if args.step_checks < 0:
        parser.error(f"--step-checks must be >= 0 (0: none), got {args.step_checks}")


def own_calibration(scratch: Path) -> Path | None:
    """The calibration directory `calibrate_into(scratch, ...)` wrote (under $AUTOTUNE_HOME, or
    the scratch directory's default home), the newest if several; None when there is none."""
    home = Path(os.environ["AUTOTUNE_HOME"]) if os.environ.get("AUTOTUNE_HOME") else scratch / ".autotune"
    found = sorted((home / "calibrations").glob("*/measurements.jsonl"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


class HostChecks:
    """The host's speed against a calibration's, measured at labelled moments of a benchmark:
    each check re-measures the same seeded sample of the calibration's kernel points, so checks
    compare with each other as well as with the calibration.

    Each check first waits for the host to go quiet (`orchestrator.quiet_host`, as a launched
    job's rank 0 does), and records how long and whether it did: the first check follows Ray's
    start-up on the host, whose dashboard, agents and log monitor took 50-70% of a core each in
    their first seconds on 2 cores (#26, 12-04), and a check timed beside them measures that
    start-up, not the host's speed."""

    def __init__(self, directory: Path | None, points: int, wait: Callable[[], QuietWait] = wait_for_quiet_host):
        self.directory, self.points, self.wait = directory, points, wait
        self.checks: list[dict] = []
        self.sample: tuple[list, int] | None = None  # the calibration's points, read once

    def __call__(self, label: str) -> None:
        if self.directory is None:
            return
        from benchmarks.host_drift import describe, sample_points, speed_of

        if self.sample is None:
            self.sample = sample_points(self.directory, self.points)
        quiet = self.wait()
        speed = speed_of(*self.sample)
        self.checks.append({"label": label, "quiet_wait_s": quiet.waited_s, "host_quiet": quiet.quiet, **speed})
        print(f"  host speed {label}: kernel time now / calibration's {describe(speed['all'])}", flush=True)

    def result(self) -> dict:
        """The checks as a result's keys (each check's overall geomean ratio, by label, and every figure)."""
        return {
            "host_check_dir": str(self.directory) if self.directory else None,
            "host_speed": {c["label"]: c["all"]["geomean_ratio"] for c in self.checks},
            "host_checks": self.checks,
        }


def champions_calibration(calibration: Path, model) -> str | None:
    """Why `calibration` is not the directory the champion `model` was fitted from, or None when
    it is (or cannot be told: a bundle or a calibration without sentinel times). The calibration
    keeps its sentinels' times in the bundle it makes (`orchestrator.sentinel`), so a directory
    whose times differ is another calibration's: its steps and kernels would price the host's
    spell against a calibration the champion never saw."""
    from orchestrator.sentinel import calibration_baseline

    kept = model.meta.get("sentinel_baseline") or {}
    found = calibration_baseline(calibration)
    if not kept or not found:
        return None
    if kept.keys() == found.keys() and all(math.isclose(kept[k], found[k], rel_tol=1e-9) for k in kept):
        return None
    shared = len(kept.keys() & found.keys())
    return (
        f"--host-check: {calibration} is not the champion's calibration (its sentinel times differ from "
        f"those the champion keeps: {shared} of {len(kept)} points in common); pass the directory the "
        "champion under --tracking-uri was calibrated into"
    )


def make_checks(calibration: Path | None, args: argparse.Namespace, workload: str, model, hardware_id: str):
    """The host's kernel checks and the calibration's own `workload` steps (benchmarks/step_checks.py),
    and the one call that runs both before the first round and after each (`measure_in_rounds`).
    A calibration directory that is not the champion's is refused (exit 2) before anything runs."""
    from benchmarks.step_checks import StepChecks  # it imports this module's helpers

    mismatch = champions_calibration(calibration, model) if calibration is not None else None
    if mismatch:
        print(mismatch, file=sys.stderr)
        raise SystemExit(2)
    host = HostChecks(calibration, args.host_check_points)
    steps = StepChecks(calibration, workload, args.step_checks, model, hardware_id)

    def between(label: str) -> None:
        host(label)
        steps(label)

    return host, steps, between


def print_own_steps(result: dict) -> None:
    """One line: the calibration's own steps over the run against the run's tasks."""
    if result.get("own_steps_signed") is not None:
        print(
            f"the calibration's own steps over the run (median of {sum('error' not in c for c in result['step_checks'])} "
            f"checks): now / stored "
            f"{result['own_steps_now_over_stored']:.3f}, champion's mean signed on them {result['own_steps_signed']:+.1%} "
            f"against the tasks' {result['mean_signed_error']:+.1%}"
        )


def repeat_spread(times: list[list[float]]) -> dict[str, float | None]:
    """How far each task's launches disagree, (max - min) / median, as a geomean and max over
    the tasks (None with one round): the noise floor a task's error is read against."""
    spreads = [(max(t) - min(t)) / statistics.median(t) for t in times if len(t) > 1]
    if not spreads:
        return {"repeat_spread_geomean": None, "repeat_spread_max": None}
    return {"repeat_spread_geomean": geomean(spreads), "repeat_spread_max": max(spreads)}


def print_other_load(result: dict) -> None:
    """One line: how busy the host's other processes kept its cores while the tasks were timed."""
    if result["host_other_share_median"] is not None:
        print(
            f"other processes while the steps were timed: median {result['host_other_share_median']:.1%} of the "
            f"host's cores, at most {result['host_other_share_max']:.1%} (over every launch)"
        )


def print_host_speed(result: dict) -> None:
    """One line: the host's kernel time against the calibration's at each check."""
    if result["host_speed"]:
        print(
            "host speed (kernel time now / calibration's): "
            + ", ".join(f"{label} {'-' if r is None else f'{r:.3f}'}" for label, r in result["host_speed"].items())
        )


def spread(errors: list[float]) -> dict[str, float]:
    """Median, mean and max error beside the geomean: one task predicted within 0.1% pulls a
    geomean of a dozen errors down by a third, so the geomean is never reported alone."""
    return {
        "median_error": statistics.median(errors),
        "mean_error": sum(errors) / len(errors),
        "max_error": max(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dlrm_task_arguments(parser, tasks=12)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="task seed (default: a fresh one, recorded)")
    add_rounds_argument(parser)
    add_host_check_arguments(parser)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/e2e_accuracy_dlrm.json"))
    args = parser.parse_args()
    check_host_check_argument(parser, args)
    tasks = draw_tasks(args)

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        fingerprint, model = champion_on_ray(scratch, args.tracking_uri, args.budget_s, 0)
        calibration = args.host_check or (None if args.tracking_uri else own_calibration(scratch))
        checks, own_steps, between = make_checks(calibration, args, "dlrm", model, fingerprint.hardware_id)

        plans = [task_plan(i, spec, args.seed) for i, spec in enumerate(tasks)]
        log = LaunchLog(len(tasks))
        launched = measure_in_rounds(
            [spec.name for spec in tasks],
            args.rounds,
            lambda i: log.timed(
                i, launch_dlrm(tasks[i], plans[i][1], iterations=args.iterations, storage=scratch / "ray_results")
            ),
            between,
        )
        rows = []
        for spec, (sharder, placement), times, shares, ended in zip(
            tasks, plans, launched, log.other_shares, log.ended_unix
        ):
            t0 = time.perf_counter()
            predicted = estimate_iteration(spec, placement, model).iteration_s * 1e3
            predict_ms = (time.perf_counter() - t0) * 1e3
            summed = estimate_iteration(spec, placement, model, simulate_graph=False).iteration_s * 1e3
            baseline = (
                estimate_iteration(spec, placement, model, include_overhead=False, simulate_graph=False).iteration_s
                * 1e3
            )
            measured = statistics.median(times)
            row = {
                "name": spec.name,
                "sharder": sharder,
                "tables": len(spec.tables),
                "batch_size": spec.batch_size,
                "rank_memory_mb": [round(b / 2**20, 1) for b in rank_memory(spec.tables, placement, spec.world_size)],
                "measured_ms": measured,
                "measured_rounds_ms": times,
                "host_other_share_rounds": shares,
                "launch_ended_unix": ended,
                "predicted_ms": predicted,
                "error": abs(predicted - measured) / measured,
                "sum_overhead_ms": summed,
                "sum_overhead_error": abs(summed - measured) / measured,
                "baseline_ms": baseline,
                "baseline_error": abs(baseline - measured) / measured,
                "predict_wall_ms": predict_ms,
            }
            rows.append(row)
            print(
                f"{row['name']:9s} {sharder:18s} T={row['tables']:2d} B={spec.batch_size:4d}  "
                f"measured {measured:8.2f} ms  predicted {predicted:8.2f} ({row['error']:6.1%})  "
                f"sum+overhead {summed:8.2f} ({row['sum_overhead_error']:6.1%})  "
                f"kernel sum {baseline:8.2f} ({row['baseline_error']:6.1%})",
                flush=True,
            )
        ray_runtime.shutdown()

    result = {
        "hardware_id": fingerprint.hardware_id,
        "command": f"python benchmarks/e2e_accuracy.py --tasks {args.tasks} "
        + ("--tracking-uri URI " if args.tracking_uri else f"--budget-s {args.budget_s:g} ")
        + f"--scale {args.scale:g} --seed {args.seed} --rounds {args.rounds}"
        + (f" --host-check DIR --host-check-points {args.host_check_points}" if args.host_check else "")
        + (f" --step-checks {args.step_checks}" if args.host_check else ""),
        "world_size": args.world_size,
        "task_seed": args.seed,
        "scale": args.scale,
        "model_ops": sorted(model.models),
        "tasks": rows,
        **error_summary([r["error"] for r in rows]),
        **signed_summary(rows),
        **repeat_spread(launched),
        **log.result(),
        **checks.result(),
        **own_steps.result(),
        "sum_overhead_geomean_error": geomean([r["sum_overhead_error"] for r in rows]),
        "baseline_geomean_error": geomean([r["baseline_error"] for r in rows]),
    }
    out = write_result(args.out, result)
    print(
        f"simulator error over {result['count']} tasks: geomean {result['geomean_error']:.1%}"
        f"{interval_text(result['geomean_interval'])}, median {result['median_error']:.1%}, mean "
        f"{result['mean_error']:.1%}, max {result['max_error']:.1%}, mean signed {result['mean_signed_error']:+.1%}"
        f"{interval_text(result['mean_signed_interval'], signed=True)} (95% intervals over the tasks)"
    )
    print(
        f"geomean error: simulator {result['geomean_error']:.1%}, sum+overhead "
        f"{result['sum_overhead_geomean_error']:.1%}, kernel-sum baseline {result['baseline_geomean_error']:.1%} "
        f"over {len(rows)} tasks"
    )
    if result["repeat_spread_geomean"] is not None:
        print(
            f"host noise: a task's {args.rounds} launches disagreed by {result['repeat_spread_geomean']:.1%} "
            f"(geomean over tasks), at most {result['repeat_spread_max']:.1%}"
        )
    print_host_speed(result)
    print_other_load(result)
    print_own_steps(result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

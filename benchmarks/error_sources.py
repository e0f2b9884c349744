"""Where a stored e2e run's error comes from, and whether re-timing the host before a run would
remove the part that is the host's (#26).

    python benchmarks/error_sources.py [--since '2026-11-27 02:44']

Over the runs `benchmarks/issue26_tally.py` counts (at least 12 tasks, a recorded seed, DLRM at
full size), each task's log error log(predicted / measured) splits into the run's lean (its
mean: one calibration, one spell of the host) and the task's scatter about it. Part of that
scatter is the measurement's own: a task is launched in `--rounds` rounds minutes apart and
its figure is their median, so the rounds' spread says how far the median moves by the host
alone (`median_noise`). Part of the lean is the host's drift since the calibration: the runs
with `--step-checks` re-timed the calibration's own steps beside the run, and the lean follows
their now / stored.

The re-anchoring trial asks whether a plan could take that drift out: every price times the
host's speed measured *before* the run, as a planner could measure it (the first step check:
a few of the calibration's own steps re-timed; or the first host check: its kernel points
re-timed). The checks after the rounds are not a plan's to use; their mean is shown only as
the ceiling of what a perfect speed reading would buy. Judged by #26's bars per run and by
paired changes (mean and 95% interval over runs).

Writes benchmarks/results/error_sources.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.issue26_tally import add_cycle_arguments, each_meets_bars, judge, meets_bars, stored_results  # noqa: E402
from predictors.evaluation import ERROR_FLOOR, geomean, mean_change  # noqa: E402

OUT = REPO / "benchmarks/results/error_sources.json"
NOISE_DRAWS = 200_000  # Monte Carlo draws for the median's spread (seeded: the figure is deterministic)


@dataclass
class Task:
    predicted_ms: float
    measured_ms: float
    rounds_ms: list[float]


@dataclass
class Stored:
    """One counted run: its data-parallel tasks and the host's speed readings beside it."""

    cycle: str
    tasks: list[Task]
    first_steps: float | None  # the first step check's own steps now / stored (before round 1)
    first_kernels: float | None  # the first host check's kernel time now / calibration's
    all_steps: float | None  # the geomean of every step check's now / stored (a ceiling, not a plan's)
    # the run's mean signed error less the champion's on its own steps re-timed beside it: how
    # the calibration carries its fit to jobs it never saw, the host's drift taken out
    transfer: float | None = None
    in_step: str | None = None  # "kept" or "dropped": the workload's in-step collective factors


IN_STEP = re.compile(r"in-step collective factors: .*")


def in_step_verdict(calibration: str, kind: str) -> str | None:
    """Whether the calibration kept `kind`'s in-step collective factors ("kept", "dropped"), from
    its printed lines (`predictors.step_fit`'s verdicts); None when it does not say."""
    line = IN_STEP.search(calibration)
    found = re.search(rf"{kind} \([^)]*\) (kept|dropped)", line.group(0)) if line else None
    return found.group(1) if found else None


def plan_reading(checks: list[dict] | None, reading: Callable[[dict], float | None]) -> float | None:
    """The first check's `reading` when that check ran before round 1 (a reading a plan could
    take); None when it ran later or failed: a later check's reading is not put in its place."""
    first = next(iter(checks or []), {})
    return reading(first) if first.get("label") == "before round 1" else None


def load(data: dict, cycle: str, calibration: str = "", kind: str = "") -> Stored:
    tasks = [
        Task(t["predicted_ms"], t["measured_ms"], list(t.get("measured_rounds_ms") or []))
        for t in data["tasks"]
        if (t.get("tensor_parallel") or 1) == 1 and t.get("predicted_ms") and t.get("measured_ms")
    ]
    steps = [c["now_over_stored"] for c in data.get("step_checks") or [] if c.get("now_over_stored")]
    return Stored(
        cycle,
        tasks,
        plan_reading(data.get("step_checks"), lambda c: c.get("now_over_stored")),
        plan_reading(data.get("host_checks"), lambda c: (c.get("all") or {}).get("geomean_ratio")),
        float(np.exp(np.mean(np.log(steps)))) if steps else None,
        data["mean_signed_error"] - data["own_steps_signed"] if data.get("own_steps_signed") is not None else None,
        in_step_verdict(calibration, kind),
    )


def stored_runs(root: Path, since: str) -> dict[str, list[Stored]]:
    """The counted runs per workload ("dlrm", "transformer"), in time order."""
    out: dict[str, list[Stored]] = {"dlrm": [], "transformer": []}
    for kind, cycle, path, data in stored_results(root, since):
        if judge(data).met is None:
            continue
        lines = path.with_name(f"calibration_{path.stem.split('_')[-1]}.txt")
        calibration = lines.read_text() if lines.exists() else ""
        out[kind].append(load(data, cycle, calibration, kind))
    return {kind: sorted(runs, key=lambda r: r.cycle) for kind, runs in out.items()}


def median_noise(sigma: float, rounds: int) -> float:
    """The sd of the median of `rounds` normal draws of sd `sigma` (a task's figure when its
    rounds scatter by `sigma` in log time)."""
    draws = np.random.default_rng(0).normal(0.0, 1.0, (NOISE_DRAWS, rounds))
    return float(sigma * np.median(draws, axis=1).std())


def log_errors(run: Stored) -> np.ndarray:
    """Each task's log(predicted / measured): its mean is the run's lean."""
    return np.log([t.predicted_ms / t.measured_ms for t in run.tasks])


def decomposition(runs: list[Stored]) -> dict:
    """The log errors' spread: in all, between runs' leans, within runs, and the part of the
    within-run spread the measurement's own round-to-round scatter accounts for."""
    logs = [log_errors(run) for run in runs]
    within = np.concatenate([run_logs - run_logs.mean() for run_logs in logs])
    leans = np.array([run_logs.mean() for run_logs in logs])
    spreads = [np.std(np.log(t.rounds_ms), ddof=1) for run in runs for t in run.tasks if len(t.rounds_ms) >= 3]
    rounds = int(np.median([len(t.rounds_ms) for run in runs for t in run.tasks if t.rounds_ms] or [1]))
    sigma = float(np.sqrt(np.mean(np.square(spreads)))) if spreads else None
    noise = median_noise(sigma, rounds) if sigma is not None else None
    within_sd = float(np.sqrt(np.sum(within**2) / (len(within) - len(runs))))
    return {
        "runs": len(runs),
        "tasks": int(sum(len(x) for x in logs)),
        "log_error_sd": float(np.concatenate(logs).std()),
        "lean_sd": float(leans.std(ddof=1)),
        "within_sd": within_sd,
        "round_sd": sigma,
        "rounds": rounds,
        "median_noise_sd": noise,
        "model_within_sd": float(np.sqrt(max(within_sd**2 - noise**2, 0.0))) if noise is not None else None,
    }


def drift_pairing(runs: list[Stored]) -> dict | None:
    """How a run's lean (mean log error) follows the host's drift read by the first step check
    and by the mean of all step checks: correlation and slope (-1: the lean is the drift)."""
    out: dict = {}
    for name in ("first_steps", "first_kernels", "all_steps"):
        pairs = [(np.log(getattr(run, name)), float(log_errors(run).mean())) for run in runs if getattr(run, name)]
        if len(pairs) >= 3:
            drift, lean = np.asarray(pairs).T
            lean_sd = float(lean.std(ddof=1))
            slope, intercept = np.polyfit(drift, lean, 1)
            rest = lean - (slope * drift + intercept)
            out[name] = {
                "runs": len(pairs),
                "correlation": float(np.corrcoef(drift, lean)[0, 1]),
                "slope": float(slope),
                "lean_sd": lean_sd,
                "lean_sd_less_drift": float(rest.std(ddof=2)),
            }
    return out or None


def transfer_by_in_step(runs: list[Stored]) -> dict:
    """The transfer (`Stored.transfer`) over the runs that have it, in all and by whether the
    calibration kept the workload's in-step collective factors: runs, mean and sd."""
    out: dict = {}
    for name in ("all", "kept", "dropped"):
        values = [r.transfer for r in runs if r.transfer is not None and (name == "all" or r.in_step == name)]
        if len(values) >= 2:
            out[name] = {"runs": len(values), "mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1))}
    return out


def bars(run: Stored, factor: float) -> dict:
    """#26's figures for `run` with every price times `factor`."""
    signed = np.array([t.predicted_ms * factor / t.measured_ms - 1.0 for t in run.tasks])
    errors = np.abs(signed)
    figures = {"geomean": geomean(errors), "max": float(errors.max()), "signed": float(signed.mean())}
    return {**figures, "met": meets_bars(figures["geomean"], figures["max"], figures["signed"])}


ANCHORS = ("first_steps", "first_kernels", "all_steps")
BAR_TASKS = 12  # #26's bars judge a run of at least 12 tasks
BAR_DRAWS = 20_000  # simulated runs per hit rate (seeded)


def hit_rate(lean_sd: float, within_sd: float, tasks: int = BAR_TASKS) -> float:
    """The share of simulated runs meeting #26's bars when a run's lean and its tasks' scatter
    about it are normal in log time with these sds: what the bars allow for a given spread."""
    return bar_shares(lean_sd, within_sd, tasks)["all"]


def bar_shares(lean_sd: float, within_sd: float, tasks: int = BAR_TASKS) -> dict[str, float]:
    """`hit_rate`'s simulated runs: the share meeting every bar ("all") and each bar alone
    ("geomean", "max", "signed"), to say which bar a spread misses most."""
    rng = np.random.default_rng(0)
    logs = rng.normal(0.0, lean_sd, (BAR_DRAWS, 1)) + rng.normal(0.0, within_sd, (BAR_DRAWS, tasks))
    signed = np.expm1(logs)
    errors = np.maximum(np.abs(signed), ERROR_FLOOR)
    figures = {"geomean": np.exp(np.log(errors).mean(axis=1)), "max": errors.max(axis=1), "signed": signed.mean(axis=1)}
    zero = np.zeros(BAR_DRAWS)
    alone = {  # each bar with the other two passed: a geomean and max of 0, a signed error of 0
        "geomean": each_meets_bars(figures["geomean"], zero, zero),
        "max": each_meets_bars(zero, figures["max"], zero),
        "signed": each_meets_bars(zero, zero, figures["signed"]),
    }
    met = each_meets_bars(figures["geomean"], figures["max"], figures["signed"])
    return {"all": float(met.mean()), **{name: float(v.mean()) for name, v in alone.items()}}


def hit_rates(parts: dict, drift: dict | None) -> dict:
    """The bars' simulated hit rate (`hit_rate`) at the spread measured, and with the model's
    part taken out: the tasks scattered by the measurement's noise alone and the runs leaning by
    the host's drift alone (the lean's share that the mean of the step checks accounts for).
    Each with the share meeting each bar alone (`bar_shares`)."""
    measured = bar_shares(parts["lean_sd"], parts["within_sd"])
    out: dict = {"as_measured": measured["all"], "as_measured_by_bar": measured}
    steps = (drift or {}).get("all_steps")
    if parts["median_noise_sd"] is not None and steps is not None:
        host_lean = steps["lean_sd"] * abs(steps["correlation"])  # over the runs with step checks
        host = bar_shares(host_lean, parts["median_noise_sd"])
        out["host_alone"], out["host_alone_by_bar"] = host["all"], host
        out["host_lean_sd"] = host_lean
    return out


def anchoring(runs: list[Stored]) -> dict:
    """Per anchor, over the runs that have it: the bars met as priced and as re-anchored, and the
    paired change of the geomean, the max and |signed| (points, mean and 95% interval)."""
    out: dict = {}
    for name in ANCHORS:
        have = [run for run in runs if getattr(run, name)]
        if not have:
            continue
        before = [bars(run, 1.0) for run in have]
        after = [bars(run, getattr(run, name)) for run in have]
        change = {
            key: mean_change([100 * (f(a) - f(b)) for a, b in zip(after, before)])
            for key, f in (
                ("geomean", lambda x: x["geomean"]),
                ("max", lambda x: x["max"]),
                ("abs_signed", lambda x: abs(x["signed"])),
            )
        }
        out[name] = {
            "runs": len(have),
            "met_as_priced": sum(b["met"] for b in before),
            "met_anchored": sum(a["met"] for a in after),
            "change_points": change,
        }
    return out


def report(kind: str, result: dict) -> None:
    d = result["decomposition"]
    print(
        f"{kind}: {d['runs']} runs, {d['tasks']} tasks; log error sd {d['log_error_sd']:.3f}: "
        f"runs' lean sd {d['lean_sd']:.3f}, within a run {d['within_sd']:.3f}"
    )
    if d["round_sd"] is not None:
        print(
            f"  rounds' scatter sd {d['round_sd']:.3f}: the median of {d['rounds']} moves {d['median_noise_sd']:.3f} by the "
            f"host alone, leaving {d['model_within_sd']:.3f} within a run to the model"
        )
    for name, p in (result["drift"] or {}).items():
        print(
            f"  lean against drift ({name}, {p['runs']} runs): correlation {p['correlation']:+.2f}, slope "
            f"{p['slope']:+.2f}; lean sd {p['lean_sd']:.3f} -> {p['lean_sd_less_drift']:.3f} with it taken out"
        )
    rates = result["hit_rates"]
    line = f"  the bars' simulated hit rate at this spread {rates['as_measured']:.0%}"
    if "host_alone" in rates:
        line += f"; the host alone (lean sd {rates['host_lean_sd']:.3f}, scatter {d['median_noise_sd']:.3f}) {rates['host_alone']:.0%}"
    print(line)
    for name in ("as_measured", "host_alone"):
        if f"{name}_by_bar" in rates:
            shares = rates[f"{name}_by_bar"]
            print(
                f"    {name.replace('_', ' ')}, each bar alone: geomean {shares['geomean']:.0%}, max {shares['max']:.0%}, "
                f"signed {shares['signed']:.0%}"
            )
    for name, t in result["transfer"].items():
        print(
            f"  the run's signed error less the champion's on its own steps beside it, in-step factors {name}: "
            f"{t['runs']} runs, mean {t['mean']:+.3f}, sd {t['sd']:.3f}"
        )
    for name, a in result["anchoring"].items():
        c = a["change_points"]
        text = ", ".join(
            f"{key} {v['mean_change']:+.2f} [{v['interval'][0]:+.2f}, {v['interval'][1]:+.2f}]"
            for key, v in c.items()
            if v and v["interval"]
        )
        print(
            f"  prices times {name}: bars met {a['met_as_priced']} -> {a['met_anchored']} of {a['runs']}; change (points) {text}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser, OUT)
    args = parser.parse_args()
    record: dict = {"command": ("python benchmarks/error_sources.py " + " ".join(sys.argv[1:])).strip()}
    for kind, runs in stored_runs(Path(args.root), args.since).items():
        if not runs:
            continue
        parts, drift = decomposition(runs), drift_pairing(runs)
        result = {
            "decomposition": parts,
            "drift": drift,
            "hit_rates": hit_rates(parts, drift),
            "transfer": transfer_by_in_step(runs),
            "anchoring": anchoring(runs),
            "cycles": [{k: v for k, v in asdict(r).items() if k != "tasks"} for r in runs],
        }
        report(kind, result)
        record[kind] = result
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

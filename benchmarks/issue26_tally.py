"""#26's bars over every stored e2e cycle: which cycles met them, for DLRM, for the transformer's
data-parallel tasks, and for both at once.

    python benchmarks/issue26_tally.py [--since '2026-11-27 02:44']

A cycle is one stamp's `dlrm_<stamp>.json` and `transformer_<stamp>.json` under
`benchmarks/results/e2e_issue26_<day>/` (written by `benchmarks/e2e_accuracy.py` and
`benchmarks/e2e_accuracy_transformer.py`). A run counts only when it meets the issue's
conditions: at least 12 tasks, a recorded task seed, DLRM at full size (`scale` 1). Its bars:
geomean at or under 10%, mean signed error within +-5%, no task above 25%.

Beside the bars, the counted DLRM runs' signed error by batch size (`by_batch`): per batch,
the mean over runs of each run's mean there, and the same less the run's own mean signed
error (its lean by batch with the run's level taken out: the host's spell moves a whole run,
a model's slope moves one batch against another), and the milliseconds a step measured over
its prediction (a missing fixed cost is the same at every batch). Intervals are over runs, not tasks: a
run's tasks share its calibration and its spell. And, per workload, how a run's signed error
follows the champion's on its calibration's own steps timed during the run (`own_steps`), and
whether a task's slower launches are those beside more of the host's other load (`other_load`,
runs whose launches report `host_other_share`). And the transformer's data-parallel tasks'
signed error less their run's by the share of the predicted step that its exposed
communication takes (`by_exposed`, runs whose tasks report `exposed_comm_ms`): whether the
steps whose gradient all-reduce the graph leaves exposed lean apart from the rest.

Writes benchmarks/results/issue26_tally.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Iterator

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import signed_errors, tasks_by_batch  # noqa: E402
from predictors.evaluation import mean_interval  # noqa: E402

OUT = REPO / "benchmarks/results/issue26_tally.json"
GEOMEAN_BAR, SIGNED_BAR, MAX_BAR, MIN_TASKS = 0.10, 0.05, 0.25, 12
STAMP = re.compile(r"^(dlrm|transformer)_(\d{4})\.json$")  # a rerun or variant has a longer name


@dataclass
class Run:
    """One benchmark's figures, and whether they meet the bars (None: not a run the bars judge)."""

    geomean: float
    max: float
    signed: float
    tasks: int
    seed: int | None
    met: bool | None
    by_batch: dict[int, list[dict]] | None = None  # DLRM: its tasks by batch size
    # the champion's mean signed error on its calibration's own steps like the run's tasks,
    # re-timed during the run (`--step-checks`): the spell's share of the run's lean
    own_steps_signed: float | None = None
    # the same when those steps were stored (the calibration's moment): what the fit left on them
    own_steps_signed_stored: float | None = None
    # per launch of a data-parallel task: (its other-load share less its task's mean share, log
    # of its ms over its task's median ms); None when the run's launches report no share
    other_load: list[tuple[float, float]] | None = None
    # transformer: per data-parallel task, (its exposed communication's share of its predicted
    # step, its signed error); None when the run's tasks report no exposed communication
    exposed: list[tuple[float, float]] | None = None


RUN_FIGURES = ("geomean_error", "max_error", "mean_signed_error")  # a run summary's figures the bars read


def run_meets_bars(summary: dict) -> bool:
    """`meets_bars` on a run's summary (`RUN_FIGURES`, as the e2e benchmarks and refits write them)."""
    return meets_bars(*(summary[k] for k in RUN_FIGURES))


def meets_bars(geomean: float, worst: float, signed: float) -> bool:
    """#26's bars for one run: geomean <= 10%, mean signed within +-5%, no task above 25%."""
    return bool(each_meets_bars(np.asarray(geomean), np.asarray(worst), np.asarray(signed)))


def each_meets_bars(geomean: np.ndarray, worst: np.ndarray, signed: np.ndarray) -> np.ndarray:
    """`meets_bars` element by element: for many simulated runs at once (`error_sources.hit_rate`)."""
    return (geomean <= GEOMEAN_BAR) & (np.abs(signed) <= SIGNED_BAR) & (worst <= MAX_BAR)


def judge(data: dict) -> Run:
    tasks = len(data.get("tasks") or [])
    eligible = tasks >= MIN_TASKS and data.get("task_seed") is not None and data.get("scale", 1.0) == 1.0
    geomean, worst, signed = data["geomean_error"], data["max_error"], data["mean_signed_error"]
    met = meets_bars(geomean, worst, signed) if eligible else None
    return Run(
        geomean,
        worst,
        signed,
        tasks,
        data.get("task_seed"),
        met,
        tasks_by_batch(data.get("tasks") or []) or None,
        data.get("own_steps_signed"),
        stored_signed(data),
        other_load_launches(data),
        exposed_tasks(data),
    )


# the bands of `lean_by_exposed`: the exposed communication's share of a predicted step
EXPOSED_BANDS = ((0.0, 0.1), (0.1, 0.2), (0.2, 0.35), (0.35, float("inf")))


def exposed_tasks(data: dict) -> list[tuple[float, float]] | None:
    """Each data-parallel task's exposed communication over its predicted step and its signed
    error (tensor-parallel tasks are not in a transformer run's `tasks`; a DLRM's have no
    `exposed_comm_ms`)."""
    rows = [t for t in data.get("tasks") or [] if t.get("exposed_comm_ms") is not None and t.get("predicted_ms")]
    shares = [t["exposed_comm_ms"] / t["predicted_ms"] for t in rows]
    return list(zip(shares, map(float, signed_errors(rows)))) or None


def lean_by_exposed(runs: list[Run]) -> dict[str, dict]:
    """Per band of exposed share (`EXPOSED_BANDS`) over the `runs` whose tasks report it: the
    mean over runs of their tasks' signed error less the run's own mean signed error there, its
    95% interval over the runs (a run's tasks share its calibration and spell), the runs and the
    tasks. A band above zero is priced higher than its run's other tasks."""
    out: dict[str, dict] = {}
    for low, high in EXPOSED_BANDS:
        means: list[float] = []
        tasks = 0
        for run in runs:
            inside = [signed for share, signed in run.exposed or [] if low <= share < high]
            if inside:
                means.append(float(np.mean(inside)) - run.signed)
                tasks += len(inside)
        if means:
            array = np.asarray(means)
            interval = list(mean_interval(array)) if len(array) >= 2 else None
            out[f"{low:.2f}-{high:.2f}"] = {
                "relative": float(array.mean()),
                "relative_interval": interval,
                "runs": len(means),
                "tasks": tasks,
            }
    return out


def other_load_launches(data: dict) -> list[tuple[float, float]] | None:
    """Each launch of a task (tensor-parallel ones left out, as from the bars), its share of
    the host's other load and its time each taken relative to its task's: a task's own size
    and level drop out, what is left is how its launches moved with the load beside them."""
    pairs: list[tuple[float, float]] = []
    for task in data.get("tasks") or []:
        if (task.get("tensor_parallel") or 1) > 1:
            continue
        launches = [
            (share, ms)
            for share, ms in zip(task.get("host_other_share_rounds") or [], task.get("measured_rounds_ms") or [])
            if share is not None
        ]
        if len(launches) < 2:
            continue
        mean_share = float(np.mean([share for share, _ in launches]))
        median_ms = float(np.median([ms for _, ms in launches]))
        pairs += [(share - mean_share, float(np.log(ms / median_ms))) for share, ms in launches]
    return pairs or None


def other_load_pairing(runs: list[Run]) -> dict | None:
    """Over the `runs` whose launches report their other load: the correlation of a launch's
    share (less its task's mean) with its time (over its task's median), and the slope (log time
    per unit of share). A positive correlation would say the launches beside more load ran
    slower; None with no such launches."""
    pairs = [pair for run in runs for pair in run.other_load or []]
    if len(pairs) < 3:
        return None
    share, log_ms = np.asarray(pairs).T
    return {
        "runs": sum(run.other_load is not None for run in runs),
        "launches": len(pairs),
        "correlation": float(np.corrcoef(share, log_ms)[0, 1]),
        "slope": float(np.polyfit(share, log_ms, 1)[0]),
    }


def stored_signed(data: dict) -> float | None:
    """The champion's mean signed error on the own steps a run re-timed, as they were stored
    (every check re-times the same steps, so the first check that did not fail gives it)."""
    return next((c["signed_stored"] for c in data.get("step_checks") or [] if "signed_stored" in c), None)


def lean_by_batch(runs: list[Run]) -> dict[int, dict]:
    """Per batch size over `runs` (the counted DLRM runs): the runs' mean signed error there
    (`signed`), that less each run's own mean signed error (`relative`), and the milliseconds a
    step measured over its prediction (`missing_ms`), each with its 95% t-interval over the
    runs; `runs` and `tasks` count what it rests on."""
    per: dict[int, dict[str, list[float]]] = {}
    tasks: dict[int, int] = {}
    for run in runs:
        for batch, rows in (run.by_batch or {}).items():
            mean = float(signed_errors(rows).mean())
            per.setdefault(batch, {"signed": [], "relative": [], "missing_ms": []})
            per[batch]["signed"].append(mean)
            per[batch]["relative"].append(mean - run.signed)
            per[batch]["missing_ms"].append(float(np.mean([r["measured_ms"] - r["predicted_ms"] for r in rows])))
            tasks[batch] = tasks.get(batch, 0) + len(rows)
    out: dict[int, dict] = {}
    for batch in sorted(per):
        entry: dict = {"runs": len(per[batch]["signed"]), "tasks": tasks[batch]}
        for key, values in per[batch].items():
            array = np.asarray(values)
            entry[key] = float(array.mean())
            entry[key + "_interval"] = list(mean_interval(array)) if len(array) >= 2 else None
        out[batch] = entry
    return out


def own_steps_pairing(runs: list[Run]) -> dict | None:
    """How a run's lean follows the champion's on its calibration's own steps timed during the
    run (`--step-checks`), over the `runs` that have both: the gap (run less own steps) as a
    mean with its sd and 95% interval over the runs, and their correlation. A gap near zero with
    a high correlation says the run leans as the steps it was fitted on do at that moment (the
    host's spell, and how those steps were priced when stored), not as something its tasks
    alone have. None with fewer than three such runs."""
    paired = [r for r in runs if r.own_steps_signed is not None]
    if len(paired) < 3:
        return None
    signed, own = np.asarray([r.signed for r in paired]), np.asarray([r.own_steps_signed for r in paired])
    gap = signed - own
    stored = [r.own_steps_signed_stored for r in paired]
    return {
        "runs": len(paired),
        "gap": float(gap.mean()),
        "gap_sd": float(gap.std(ddof=1)),
        "gap_interval": list(mean_interval(gap)),
        "correlation": float(np.corrcoef(signed, own)[0, 1]),
        # the signed bar on the runs' tasks beside the same bar on the steps the champion was
        # fitted on: as stored (what the fit left) and re-timed during the run (the host then)
        "signed_bar": {
            "tasks": int(np.sum(np.abs(signed) <= SIGNED_BAR)),
            "own_steps_stored": sum(abs(v) <= SIGNED_BAR for v in stored if v is not None),
            "own_steps_stored_known": sum(v is not None for v in stored),
            "own_steps_now": int(np.sum(np.abs(own) <= SIGNED_BAR)),
        },
    }


def print_pairing(kind: str, pairing: dict | None) -> None:
    if pairing is None:
        return
    print(
        f"{kind}: run's signed error less the champion's on its own steps timed beside it "
        f"{pairing['gap']:+.1%} [{pairing['gap_interval'][0]:+.1%}, {pairing['gap_interval'][1]:+.1%}] "
        f"(sd {pairing['gap_sd']:.1%}), correlation {pairing['correlation']:.2f} over {pairing['runs']} runs"
    )
    bar = pairing["signed_bar"]
    print(
        f"{kind}: within the +-{SIGNED_BAR:.0%} signed bar: the run's tasks in {bar['tasks']} of {pairing['runs']} runs; "
        f"the champion on its own steps as stored in {bar['own_steps_stored']} of {bar['own_steps_stored_known']}, "
        f"re-timed beside the run in {bar['own_steps_now']} of {pairing['runs']}"
    )


def print_lean(lean: dict[int, dict]) -> None:
    print("DLRM signed error by batch (mean over runs [95% over runs]; relative: less the run's own mean)")
    for batch, e in lean.items():
        signed = "" if e["signed_interval"] is None else " [{:+.1%}, {:+.1%}]".format(*e["signed_interval"])
        relative = "" if e["relative_interval"] is None else " [{:+.1%}, {:+.1%}]".format(*e["relative_interval"])
        missing = "" if e["missing_ms_interval"] is None else " [{:+.2f}, {:+.2f}]".format(*e["missing_ms_interval"])
        print(
            f"  batch {batch:>5}: {e['signed']:+6.1%}{signed}  relative {e['relative']:+6.1%}{relative}"
            f"  measured - predicted {e['missing_ms']:+.2f} ms{missing}  ({e['runs']} runs, {e['tasks']} tasks)"
        )


def print_exposed(lean: dict[str, dict]) -> None:
    if not lean:
        return
    print(
        "transformer DP signed error less the run's, by exposed communication over the predicted step (95% over runs)"
    )
    for band, e in lean.items():
        interval = "" if e["relative_interval"] is None else " [{:+.1%}, {:+.1%}]".format(*e["relative_interval"])
        print(f"  {band}: {e['relative']:+6.1%}{interval}  ({e['runs']} runs, {e['tasks']} tasks)")


def added(root: Path) -> dict[str, datetime]:
    """When git first committed each stored result (its path -> commit time)."""
    log = subprocess.run(
        ["git", "log", "--diff-filter=A", "--name-only", "--format=@%cI", "--", "e2e_issue26_*"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    out: dict[str, datetime] = {}
    when = None
    for line in log.splitlines():
        if line.startswith("@"):
            when = datetime.fromisoformat(line[1:])
        elif line.strip() and when is not None:
            out.setdefault(line.removeprefix("benchmarks/results/"), when)  # git names it from the repository's root
    return out


def started(stamp: str, committed: datetime | None) -> str:
    """The cycle's start, "YYYY-MM-DD HH:MM": the last time of day `stamp` (HHMM) at or before
    its commit (a day's directory holds the cycles of the night after it too); the stamp alone
    when the file is not committed yet."""
    if committed is None:
        return f"uncommitted {stamp[:2]}:{stamp[2:]}"
    at = committed.replace(hour=int(stamp[:2]), minute=int(stamp[2:]), second=0, microsecond=0)
    return (at if at <= committed else at - timedelta(days=1)).strftime("%Y-%m-%d %H:%M")


def stored_results(root: Path, since: str) -> Iterator[tuple[str, str, Path, dict]]:
    """(benchmark, cycle start, path, its JSON) for every stored cycle's result started at or
    after `since` (`cycle_of`), in path order."""
    commits = added(root)
    for path in sorted(root.glob("e2e_issue26_*/*.json")):
        found = cycle_of(path, commits)
        if found is not None and found[1] >= since:
            yield found[0], found[1], path, json.loads(path.read_text())


def cycles(root: Path, since: str) -> dict[str, dict[str, Run]]:
    """{"YYYY-MM-DD HH:MM": {"dlrm": Run, "transformer": Run}} for every stored cycle started at
    or after `since`, in time order."""
    out: dict[str, dict[str, Run]] = {}
    for kind, cycle, _, data in stored_results(root, since):
        out.setdefault(cycle, {})[kind] = judge(data)
    return dict(sorted(out.items()))


def cycle_of(path: Path, commits: dict[str, datetime]) -> tuple[str, str] | None:
    """A stored result's benchmark ("dlrm", "transformer") and the start of its cycle
    (`started`); None for a file that is not a cycle's (a rerun or variant). `commits`:
    `added`'s answer for its results folder."""
    match = STAMP.match(path.name)
    if not match:
        return None
    return match.group(1), started(match.group(2), commits.get(f"{path.parent.name}/{path.name}"))


def _figures(run: Run) -> dict:
    """A run as the tally records it: its figures, not its tasks' errors."""
    return {k: v for k, v in asdict(run).items() if k not in ("by_batch", "other_load")}


def cell(run: Run | None) -> str:
    if run is None:
        return f"{'not run':<27}"
    verdict = {True: "met", False: "MISSED", None: "n/a"}[run.met]
    own = f" own steps {run.own_steps_signed:+.1%}" if run.own_steps_signed is not None else ""
    return f"{run.geomean:5.1%} {run.max:5.1%} {run.signed:+6.1%} {verdict:<6}{own}"


def add_cycle_arguments(parser: argparse.ArgumentParser, out: Path) -> None:
    """The options of a benchmark over the stored cycles: the first counted, where they lie,
    and where its JSON goes."""
    parser.add_argument("--since", default="", help='the first cycle counted, "YYYY-MM-DD HH:MM"')
    parser.add_argument("--root", default=str(REPO / "benchmarks/results"))
    parser.add_argument("--out", default=str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser, OUT)
    args = parser.parse_args()
    found = cycles(Path(args.root), args.since)
    print(f"{'cycle':<16} {'DLRM geomean max signed':<27} | {'transformer DP geomean max signed':<27}")
    for name, runs in found.items():
        print(f"{name:<16} {cell(runs.get('dlrm'))} | {cell(runs.get('transformer'))}")
    counted = {
        kind: [r[kind] for r in found.values() if kind in r and r[kind].met is not None]
        for kind in ("dlrm", "transformer")
    }
    judged = {kind: [run.met for run in runs] for kind, runs in counted.items()}
    both = [
        r["dlrm"].met and r["transformer"].met
        for r in found.values()
        if all(k in r and r[k].met is not None for k in ("dlrm", "transformer"))
    ]
    summary = {kind: {"met": sum(v), "judged": len(v)} for kind, v in judged.items()}
    summary["both"] = {"met": sum(both), "judged": len(both)}
    print("; ".join(f"{kind}: {s['met']} of {s['judged']} met every bar" for kind, s in summary.items()))
    lean = lean_by_batch(counted["dlrm"])
    print_lean(lean)
    exposed = lean_by_exposed(counted["transformer"])
    print_exposed(exposed)
    pairing = {kind: own_steps_pairing(runs) for kind, runs in counted.items()}
    for kind, figures in pairing.items():
        print_pairing(kind, figures)
    load = {kind: other_load_pairing(runs) for kind, runs in counted.items()}
    for kind, figures in load.items():
        if figures is not None:
            print(
                f"{kind}: a launch's other load (less its task's mean) against its time (over its task's median): "
                f"correlation {figures['correlation']:+.2f}, slope {figures['slope']:+.2f} log-ms per unit share "
                f"({figures['launches']} launches of {figures['runs']} run(s))"
            )
    command = "python benchmarks/issue26_tally.py " + " ".join(sys.argv[1:])
    record = {
        "command": command.strip(),
        "summary": summary,
        "by_batch": lean,
        "by_exposed": exposed,
        "own_steps": pairing,
        "other_load": load,
        "cycles": {k: {n: _figures(r) for n, r in v.items()} for k, v in found.items()},
    }
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Whether a DLRM task's lean goes with anything about its tables or its sharder, within a
batch size, over every stored full-size e2e run.

    python benchmarks/lean_by_task.py [FILES...] [--since '2026-11-27 02:44']

FILES: `benchmarks/e2e_accuracy.py` results (default: every `dlrm_<stamp>.json` under
`benchmarks/results/e2e_issue26_*/`, as `benchmarks/dlrm_lean.py` reads them, from the cycles
started at or after `--since`, as `benchmarks/issue26_tally.py` dates them). Each task's
tables are drawn again from its run's recorded seed (`random_dlrm_tasks`, the generator the
benchmark drew them with); a run whose redrawn tasks do not have its stored table counts was
drawn by another version of the generator and is left out, named. A task's lean is its signed
error less its run's mean (a run's spell moves all its tasks at once). Within each batch the
lean is correlated with the log of the task's table count, table bytes, lookups a step (batch
x summed pooling), summed MLP width and measured step; and, over all batches, each sharder's
mean lean with its 95% interval over tasks. A lean that follows none of them is a cost every
task at that batch pays, whatever its tables (#26's batch-128 shortfall). Reads stored figures
only; nothing is measured.

Writes benchmarks/results/lean_by_task.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.dlrm_lean import stored_runs  # noqa: E402
from benchmarks.e2e_accuracy import signed_errors  # noqa: E402
from benchmarks.issue26_tally import added, cycle_of  # noqa: E402
from predictors.evaluation import mean_interval  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402

OUT = REPO / "benchmarks/results/lean_by_task.json"
FEATURES = ("log_tables", "log_table_bytes", "log_lookups", "log_mlp_width", "log_measured_ms")


def task_features(spec: JobSpec, measured_ms: float) -> dict[str, float]:
    """What a task's tables and step are, as the correlations read them (logs: they span decades)."""
    width = sum(spec.dense.bottom_mlp) + sum(spec.dense.top_mlp)
    return {
        "log_tables": math.log(len(spec.tables)),
        "log_table_bytes": math.log(sum(t.bytes for t in spec.tables)),
        "log_lookups": math.log(spec.batch_size * sum(t.pooling_factor for t in spec.tables)),
        "log_mlp_width": math.log(max(width, 1)),
        "log_measured_ms": math.log(measured_ms),
    }


def run_tasks(path: Path) -> tuple[list[dict], str | None]:
    """A stored run's tasks, each with its lean and features; or why the run is left out."""
    data = json.loads(path.read_text())
    if data.get("scale", 1.0) != 1.0 or data.get("task_seed") is None:
        return [], "down-scaled or no recorded seed"
    rows = data["tasks"]
    specs = {s.name: s for s in random_dlrm_tasks(len(rows), data.get("world_size", 2), data["task_seed"], 1.0)}
    if any(r["name"] not in specs or len(specs[r["name"]].tables) != r["tables"] for r in rows):
        return [], "its tasks redrawn from the seed have other table counts (another generator)"
    signed = signed_errors(rows)
    level = float(signed.mean())
    return [
        {
            "batch_size": int(r["batch_size"]),
            "sharder": r["sharder"],
            "lean": float(s - level),
            **task_features(specs[r["name"]], r["measured_ms"]),
        }
        for r, s in zip(rows, signed)
    ], None


def correlations(tasks: list[dict]) -> dict[int, dict]:
    """Per batch: its tasks and each feature's correlation with their lean (None: no spread)."""
    by_batch: dict[int, list[dict]] = defaultdict(list)
    for t in tasks:
        by_batch[t["batch_size"]].append(t)
    out = {}
    for batch, rows in sorted(by_batch.items()):
        lean = np.array([t["lean"] for t in rows])
        r: dict[str, float | None] = {}
        for name in FEATURES:
            x = np.array([t[name] for t in rows])
            r[name] = float(np.corrcoef(x, lean)[0, 1]) if len(rows) > 2 and x.std() > 0 and lean.std() > 0 else None
        out[batch] = {"tasks": len(rows), "mean_lean": float(lean.mean()), "correlation": r}
    return out


def by_sharder(tasks: list[dict]) -> dict[str, dict]:
    """Each sharder's tasks, mean lean and its 95% interval over them."""
    groups: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        groups[t["sharder"]].append(t["lean"])
    return {
        name: {
            "tasks": len(leans),
            "mean_lean": float(np.mean(leans)),
            "interval": list(mean_interval(np.array(leans))) if len(leans) >= 2 else None,
        }
        for name, leans in sorted(groups.items())
    }


def since(paths: list[Path], first: str) -> list[Path]:
    """The runs of the cycles started at or after `first` ("YYYY-MM-DD HH:MM"; "" keeps all)."""
    commits = added(REPO / "benchmarks/results")
    return [p for p in paths if (found := cycle_of(p, commits)) is not None and found[1] >= first]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--since", default="", help='the first cycle counted, "YYYY-MM-DD HH:MM"')
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    paths = [p.resolve() for p in args.files] or since(stored_runs(), args.since)
    tasks: list[dict] = []
    used, skipped = [], {}
    for path in paths:
        rows, why = run_tasks(path)
        name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        if why:
            skipped[name] = why
        else:
            used.append(name)
            tasks += rows
    if not tasks:
        sys.exit("no stored full-size DLRM run could be redrawn")
    print(f"{len(tasks)} tasks of {len(used)} runs ({len(skipped)} left out: {sorted(set(skipped.values()))})")
    batches = correlations(tasks)
    for batch, row in batches.items():
        cells = ", ".join(f"{k} {v:+.2f}" if v is not None else f"{k} -" for k, v in row["correlation"].items())
        print(f"batch {batch:5d}: {row['tasks']:3d} tasks, lean {row['mean_lean']:+6.1%}; correlation with {cells}")
    sharders = by_sharder(tasks)
    for name, row in sharders.items():
        ci = row["interval"]
        span = f" [{ci[0]:+.1%}, {ci[1]:+.1%}]" if ci else ""
        print(f"sharder {name:18s} {row['tasks']:3d} tasks, lean {row['mean_lean']:+6.1%}{span}")
    command = "python benchmarks/lean_by_task.py " + " ".join(map(str, args.files))
    command += f" --since '{args.since}'" if args.since else ""
    result = {
        "command": command.strip(),
        "runs": used,
        "left_out": skipped,
        "by_batch": batches,
        "by_sharder": sharders,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

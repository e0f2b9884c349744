"""Every task of a stored DLRM e2e run: each rank's TBE lookup timed alone (as the calibration
probes it) against the registered model's price, beside the task's end-to-end error.

    .venv/bin/python benchmarks/tbe_alone.py RESULT --tracking-uri URI [--out FILE]

RESULT: the JSON of `benchmarks/e2e_accuracy.py`; URI: the store whose champion priced it.
Says whether a task predicted short is short in its lookups (the model under the lookup
alone) or elsewhere in the step (`benchmarks/step_breakdown.py` breaks a few down op by op).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.e2e_accuracy import task_plan, write_result  # noqa: E402
from benchmarks.step_breakdown import isolated_tbe  # noqa: E402
from predictors.evaluation import geomean  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402


def heavier_rank_ratio(ranks: list[dict]) -> float:
    """The model's price over the time alone of the lookups (forward + backward) of the rank
    whose lookups take longest alone: the rank that sets the step."""
    totals = [
        (sum(v["model_ms"] for v in ops.values()), sum(v["alone_ms"] for v in ops.values())) for ops in ranks if ops
    ]
    model_ms, alone_ms = max(totals, key=lambda t: t[1])
    return model_ms / alone_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/tbe_alone.json"))
    args = parser.parse_args()

    from orchestrator import registry
    from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

    result = json.loads(args.result.read_text())
    registry.configure(args.tracking_uri)
    hardware_id = HardwareFingerprint([local_node_fingerprint()]).hardware_id
    model = registry.load_performance_model(args.tracking_uri, hardware_id)
    torch.set_num_threads(1)
    specs = random_dlrm_tasks(len(result["tasks"]), result["world_size"], result["task_seed"], result["scale"])
    rows = []
    for i, (spec, task) in enumerate(zip(specs, result["tasks"])):
        _, plan = task_plan(i, spec, result["task_seed"])
        ranks = [isolated_tbe(spec, plan, model, r) for r in range(spec.world_size)]
        error = (task["predicted_ms"] - task["measured_ms"]) / task["measured_ms"]
        ratio = heavier_rank_ratio(ranks)
        line = f"{task['name']:9s} B={spec.batch_size:4d} e2e {error:+6.1%} heavier rank {ratio:.2f} |"
        for r, ops in enumerate(ranks):
            line += "".join(f" r{r} {op[10:]} {v['model_ms']:.2f}/{v['alone_ms']:.2f}" for op, v in ops.items())
        print(line + "  (model/alone ms)", flush=True)
        rows.append(
            {
                "task": task["name"],
                "batch_size": spec.batch_size,
                "e2e_signed_error": error,
                "heavier_rank_model_over_alone": ratio,
                "ranks": ranks,
            }
        )
    ratios = [r["heavier_rank_model_over_alone"] for r in rows]
    summary = {"geomean": geomean(ratios), "min": min(ratios), "max": max(ratios)}
    print(
        f"heavier rank's lookups, model / alone: geomean {summary['geomean']:.3f} "
        f"({summary['min']:.2f}-{summary['max']:.2f}) over {len(rows)} tasks"
    )
    command = (
        f"python benchmarks/tbe_alone.py {args.result.relative_to(REPO) if args.result.is_absolute() else args.result}"
    )
    out = write_result(args.out, {"command": command + " --tracking-uri URI", "summary": summary, "tasks": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

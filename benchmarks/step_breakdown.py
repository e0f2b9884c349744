"""Where a DLRM step's time goes, op by op: the graph's predicted costs against a traced real
step, and each rank's TBE timed alone against its model.

    .venv/bin/python benchmarks/step_breakdown.py --tracking-uri URI [--seed S] [--tasks 12] [--pick 3,10]

For each picked task of `benchmarks/e2e_accuracy.py`'s draw (the same seed, sharders in turn,
full size): the predicted iteration and step overhead; per rank, the execution graph's ops
priced by the registered model (in-step factors applied) beside the time the traced steps
spent in each top-level op (mean over the captured steps, `benchmarks/trace_roundtrip.py`'s
capture: 2 gloo ranks, one thread each) and the idle time between them, and each collective's
work item from issue to completion; and the rank's own table set timed alone
(`probes.embedding.measure_tbe`; the backward also warm, as probed before issue #26) beside the
model's forward and backward.
The gap between the traced ops and the step is what no kernel explains: waiting for the
other rank and the collectives, and the framework. This is how issue #26 found that the TBE
backward ran ~2x its warm-cache probe time inside a step. Writes
benchmarks/results/step_breakdown.json.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.e2e_accuracy import task_plan, write_result  # noqa: E402
from benchmarks.trace_roundtrip import capture  # noqa: E402
from predictors.dlrm_estimator import estimate_iteration  # noqa: E402
from predictors.dlrm_graph import build_dlrm_graph  # noqa: E402
from predictors.simulator import model_cost  # noqa: E402
from probes.embedding import measure_tbe  # noqa: E402
from probes.vocabulary.ops import EMBEDDING_BWD_OP  # noqa: E402
from probes.vocabulary.table_shards import DATA_PARALLEL, table_shards  # noqa: E402
from probes.vocabulary.tbe_features import expected_features  # noqa: E402
from probes.workloads.random_dlrm import random_dlrm_tasks  # noqa: E402

TOP_OPS = 8


def traced_collectives(trace: dict) -> dict[str, float]:
    """Per collective work item name (e.g. `gloo:all_to_all`) its mean milliseconds per step,
    from issue to completion on the backend's thread."""
    per_item: Counter = Counter()
    for step in trace["steps"]:
        for c in step["comm"]:
            per_item[c["name"]] += (c["end_s"] - c["start_s"]) * 1e3 / len(trace["steps"])
    return dict(per_item)


def traced_ops(trace: dict) -> tuple[Counter, float, float]:
    """Per top-level op name its mean milliseconds per captured step, the mean step, and the
    mean idle time on the step's thread between ops (waits and framework work)."""
    per_op: Counter = Counter()
    steps, idle = [], []
    for step in trace["steps"]:
        ops = sorted(step["ops"], key=lambda o: o["start_s"])
        for o in ops:
            per_op[o["name"]] += (o["end_s"] - o["start_s"]) * 1e3 / len(trace["steps"])
        covered, end = 0.0, 0.0
        for o in ops:
            covered += max(0.0, o["end_s"] - max(o["start_s"], end))
            end = max(end, o["end_s"])
        steps.append(step["step_s"] * 1e3)
        idle.append(step["step_s"] * 1e3 - covered * 1e3)
    return per_op, float(np.mean(steps)), float(np.mean(idle))


def isolated_tbe(spec, plan, model, rank: int) -> dict:
    """The rank's table set (whole global batch) timed alone against the model's prediction:
    `model_ms` as a step prices it (in-step factor applied), `isolated_model_ms` before it."""
    local = [s.shape for s in table_shards(spec, plan) if s.rank == rank and s.kind != DATA_PARALLEL]
    if not local:
        return {}
    batch = spec.batch_size * spec.world_size
    features = expected_features(local, batch, seed=spec.seed)
    out = {}
    warm = {row.op: row.median_s for row in measure_tbe(local, batch, max_seconds=2.0, cold_backward=False)}
    for row in measure_tbe(local, batch, max_seconds=2.0):
        isolated = model.predict_params(row.op, features)
        predicted = isolated if model.in_step is None else model.in_step.in_step(row.op, isolated)
        out[row.op] = {"alone_ms": row.median_s * 1e3, "model_ms": predicted * 1e3, "isolated_model_ms": isolated * 1e3}
        if row.op == EMBEDDING_BWD_OP:  # the probe before issue #26: the setup forward's rows still cached
            out[row.op]["alone_warm_ms"] = warm[row.op] * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True, help="the champion registered here prices the graphs")
    parser.add_argument("--seed", type=int, default=0, help="the e2e benchmark's task seed")
    parser.add_argument("--tasks", type=int, default=12, help="tasks drawn (as the e2e benchmark draws them)")
    parser.add_argument("--pick", default="0,1,2", help="which of the drawn tasks to break down")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/step_breakdown.json"))
    args = parser.parse_args()

    from orchestrator import registry
    from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

    registry.configure(args.tracking_uri)
    hardware_id = HardwareFingerprint([local_node_fingerprint()]).hardware_id
    model = registry.load_performance_model(args.tracking_uri, hardware_id)
    torch.set_num_threads(1)
    picked = {int(i) for i in args.pick.split(",")}
    rows = []
    for i, spec in enumerate(random_dlrm_tasks(args.tasks, 2, args.seed, args.scale)):
        if i not in picked:
            continue
        sharder, plan = task_plan(i, spec, args.seed)
        estimate = estimate_iteration(spec, plan, model)
        graph, cost = build_dlrm_graph(spec, plan), model_cost(model)
        traces = capture(spec.to_dict(), plan)
        ranks = []
        for r, trace in enumerate(traces):
            predicted: Counter = Counter()
            for op in graph.ranks[r]:
                predicted[op.name] += cost(op) * 1e3
            per_op, step_ms, idle_ms = traced_ops(trace)
            ranks.append(
                {
                    "predicted_ops_ms": dict(predicted.most_common(TOP_OPS)),
                    "traced_ops_ms": dict(per_op.most_common(TOP_OPS)),
                    "traced_step_ms": step_ms,
                    "traced_idle_ms": idle_ms,
                    "traced_collectives_ms": traced_collectives(trace),
                    "tbe": isolated_tbe(spec, plan, model, r),
                }
            )
        row = {
            "name": spec.name,
            "sharder": sharder,
            "tables": len(spec.tables),
            "batch_size": spec.batch_size,
            "rows": sum(t.num_embeddings for t in spec.tables),
            "predicted_ms": estimate.iteration_s * 1e3,
            "predicted_overhead_ms": estimate.overhead_s * 1e3,
            "unprofiled_step_ms": max(t["unprofiled_step_s"] for t in traces) * 1e3,
            "ranks": ranks,
        }
        rows.append(row)
        print(
            f"{spec.name} {sharder} T={row['tables']} B={spec.batch_size} rows={row['rows'] / 1e6:.2f}M: "
            f"predicted {row['predicted_ms']:.2f} ms (overhead {row['predicted_overhead_ms']:.2f}), "
            f"step {row['unprofiled_step_ms']:.2f} ms",
            flush=True,
        )
        for r, rank in enumerate(ranks):
            fmt = lambda d: ", ".join(f"{k} {v:.2f}" for k, v in d.items())  # noqa: E731
            print(f"  rank {r} predicted: {fmt(rank['predicted_ops_ms'])}")
            print(
                f"  rank {r} traced (step {rank['traced_step_ms']:.2f}, idle {rank['traced_idle_ms']:.2f}): "
                f"{fmt(rank['traced_ops_ms'])}"
            )
            print(f"  rank {r} traced collectives: {fmt(rank['traced_collectives_ms'])}")
            for op, t in rank["tbe"].items():
                warm = f" (warm, as probed before: {t['alone_warm_ms']:.2f})" if "alone_warm_ms" in t else ""
                print(
                    f"  rank {r} {op}: alone {t['alone_ms']:.2f} ms{warm}, model {t['model_ms']:.2f} ms "
                    f"({t['isolated_model_ms']:.2f} before the in-step factor)"
                )
    result = {
        "command": f"python benchmarks/step_breakdown.py --tracking-uri URI --seed {args.seed} --tasks {args.tasks} "
        f"--pick {args.pick} --scale {args.scale:g}",
        "hardware_id": hardware_id,
        "tasks": rows,
    }
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()

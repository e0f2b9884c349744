"""Whether a small transformer task's kernels lie inside what its calibration measured, and how
its champion prices the task against the same task at a larger batch (#26, 12-05 11:39: the
one-layer tasks ran 1.4-1.9 ms over their predictions while the champion priced halving the
batch as a drop of a quarter).

    .venv/bin/python benchmarks/small_step_floor.py \
        --measurements benchmarks/results/e2e_issue26_20261205/measurements_1139.jsonl.gz \
        --result benchmarks/results/e2e_issue26_20261205/transformer_1139.json --task gpt0-tp1 \
        [--tracking-uri URI --batches 2,4]

Per kernel op of the task's graph: the smallest size the calibration measured (`flops` for
GEMMs, `bytes` otherwise) against the task's smallest; an op whose task size is below the
calibration's is priced by extrapolation. With `--tracking-uri` (the calibration's store),
also the champion's step price, kernel sum and overhead at each batch, and the kernel sum by
op. Writes benchmarks/results/small_step_floor.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.transformer_graph import build_transformer_graph  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402


def size(params: dict) -> float:
    """The size an op's range is read on: a GEMM's flops, any other op's bytes."""
    return float(params.get("flops", params.get("bytes", 0.0)))


def ranges(measurements: Path, spec: TransformerSpec) -> dict[str, dict[str, float]]:
    """Per kernel op of the task's graph: the calibration's smallest measured size and the task's."""
    measured: dict[str, float] = {}
    for row in read_rows(measurements):
        if size(row.params) > 0:
            measured[row.op] = min(measured.get(row.op, float("inf")), size(row.params))
    task: dict[str, float] = {}
    for op in build_transformer_graph(spec, None, fold=True).ranks[0]:
        if op.kind != "collective" and op.params and size(op.params) > 0:
            task[op.op] = min(task.get(op.op, float("inf")), size(op.params))
    return {op: {"task_min": task[op], "measured_min": measured.get(op, float("nan"))} for op in sorted(task)}


def prices(uri: str, hardware_id: str, spec: TransformerSpec, batches: list[int]) -> dict[int, dict]:
    """The champion's step price, kernel sum, overhead and kernel sum by op at each batch."""
    from orchestrator import registry
    from predictors.simulator import model_cost
    from predictors.transformer_estimator import estimate_transformer_iteration

    registry.configure(uri)
    model = registry.load_performance_model(uri, hardware_id)
    out: dict[int, dict] = {}
    for batch in batches:
        sized = TransformerSpec.from_dict({**spec.to_dict(), "batch_size": batch})
        estimate = estimate_transformer_iteration(sized, model)
        cost = model_cost(model, set(), in_context=False)
        by_op: dict[str, float] = defaultdict(float)
        for op in build_transformer_graph(sized, None, fold=True).ranks[0]:
            by_op[op.op] += cost(op) * 1e3
        out[batch] = {
            "predicted_ms": estimate.iteration_s * 1e3,
            "kernel_sum_ms": estimate.kernel_sum_s * 1e3,
            "overhead_ms": estimate.overhead_s * 1e3,
            "kernel_ms_by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=Path, required=True, help="a calibration's measurements.jsonl(.gz)")
    parser.add_argument("--result", type=Path, required=True, help="an e2e_accuracy_transformer.py JSON")
    parser.add_argument("--task", required=True, help="a task name in the result, e.g. gpt0-tp1")
    parser.add_argument("--tracking-uri", default=None, help="the calibration's store, to price the task")
    parser.add_argument("--batches", default="", help="batch sizes to price, comma-separated (default: the task's)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/small_step_floor.json"))
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    names = [t["name"] for t in result["tasks"]]
    if args.task not in names:
        parser.error(f"--task must be one of {names}, got {args.task!r}")
    task = result["tasks"][names.index(args.task)]
    spec = TransformerSpec.from_dict(task["spec"])
    record: dict = {
        "task": args.task,
        "measured_rounds_ms": task["measured_rounds_ms"],
        "ranges": ranges(args.measurements, spec),
    }
    for op, r in record["ranges"].items():
        below = " BELOW the measured range" if r["task_min"] < r["measured_min"] else ""
        print(
            f"{op:16s} task's smallest {r['task_min']:12.4g}  calibration's smallest {r['measured_min']:12.4g}{below}"
        )
    if args.tracking_uri:
        batches = [int(b) for b in args.batches.split(",") if b] or [spec.batch_size]
        record["prices"] = prices(args.tracking_uri, result["hardware_id"], spec, batches)
        for batch, p in record["prices"].items():
            print(
                f"batch {batch}: predicted {p['predicted_ms']:.2f} ms, kernel sum {p['kernel_sum_ms']:.2f}, "
                f"overhead {p['overhead_ms']:.2f}; "
                + ", ".join(f"{op} {ms:.3f}" for op, ms in list(p["kernel_ms_by_op"].items())[:4])
            )
    record["command"] = "python benchmarks/small_step_floor.py " + " ".join(sys.argv[1:])
    print(f"wrote {write_result(args.out, record)}")


if __name__ == "__main__":
    main()

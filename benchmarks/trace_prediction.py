"""Predicting from users' own traces: jobs run on 2 gloo ranks under torch.profiler, their
per-rank Kineto traces exported as a user would, read back (predictors/kineto_trace.py) and
priced with the registered champion; each profiled step's prediction against its traced time.

    .venv/bin/python benchmarks/trace_prediction.py --tracking-uri URI [--steps 5] [--out PATH]
        [--jobs dlrm,transformer,cnn] [--transformer-spec JSON]

Jobs: a DLRM task and a data-parallel transformer of this project's reference workloads, and
a small CNN (convolutions, batch norm, pooling, a classifier; DDP, SGD with momentum) written
here as a user would write one, which no probe or graph builder of the project knows. Per job:
every active profiler step is rebuilt from the trace alone (measured op times: how well the
graph replays the trace) and predicted (every op the champion models priced by it, the rest as
traced); errors against the traced step (earliest rank's start to latest rank's end), medians
over the steps, and the share of rank 0's traced op time the champion priced; and rank 0's ops
grouped by name (and the model op pricing them), traced beside priced (in-step factors applied),
median over the steps: where a step's time goes that the prediction misses. `--transformer-spec`
traces another transformer (a task's `spec` from `benchmarks/e2e_accuracy_transformer.py`'s
JSON). The ranks run with the product's allocator setting (`probes.host_allocator`), as its
probe and training workers do. Writes benchmarks/results/trace_prediction.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from predictors.kineto_trace import (  # noqa: E402
    MARKS,
    TraceError,
    TracePrediction,
    common_steps,
    load_traces,
    predict_step,
    steps_for,
)
from probes.host_allocator import apply_to_child_processes  # noqa: E402

WORLD = 2
WARMUP = 2


def _cnn_step(rank: int):
    """The user's job: a small CNN on 64x64 images, DDP, SGD with momentum."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    return step


def _dlrm_step(rank: int, seed: int):
    from probes.workloads.dlrm import ShardedDLRM, cycling_step
    from probes.workloads.random_dlrm import random_dlrm_tasks

    (spec,) = random_dlrm_tasks(1, WORLD, seed, 0.05)
    placement = [i % WORLD for i in range(len(spec.tables))]
    return cycling_step(ShardedDLRM(spec, placement, rank, WORLD, torch.device("cpu")))


# The reference transformer traced unless --transformer-spec names another.
TRANSFORMER_SPEC = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 64, "batch_size": 8, "world_size": WORLD}


def _transformer_step(rank: int, spec_dict: dict[str, Any]):
    from probes.vocabulary.transformer_spec import TransformerSpec
    from probes.workloads.transformer import ParallelTransformer

    spec = TransformerSpec.from_dict({**spec_dict, "world_size": WORLD})
    return ParallelTransformer(spec, rank, torch.device("cpu")).step


def _rank(rank: int, init: str, out: str, job: str, steps: int, seed: int, spec: dict[str, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        step = {
            "cnn": lambda: _cnn_step(rank),
            "dlrm": lambda: _dlrm_step(rank, seed),
            "transformer": lambda: _transformer_step(rank, spec),
        }[job]()
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            schedule=schedule(wait=0, warmup=WARMUP, active=steps),
            on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/trace_rank{rank}.json"),
        ) as prof:
            for _ in range(WARMUP + steps):
                step()
                dist.barrier()  # as a data loader's synchronisation would: steps start together
                prof.step()
    finally:
        dist.destroy_process_group()


def by_op(found: TracePrediction) -> dict[str, dict[str, float]]:
    """Rank 0's ops of one step grouped by name (and the model op pricing them): count, traced
    and priced milliseconds (an op nothing prices counts as traced on both sides)."""
    out: dict[str, dict[str, float]] = {}
    for before, after, model_op in zip(found.graph.ranks[0], found.priced.graph.ranks[0], found.priced.model_ops):
        if before.name in MARKS:
            continue
        key = before.name + (f" -> {model_op}" if model_op else "")
        row = out.setdefault(key, {"count": 0, "traced_ms": 0.0, "priced_ms": 0.0})
        row["count"] += 1
        row["traced_ms"] += (before.duration_s or 0.0) * 1e3
        row["priced_ms"] += (after.duration_s or 0.0) * 1e3
    return out


def median_by_op(steps: list[dict[str, dict[str, float]]], top: int = 25) -> dict[str, dict[str, float]]:
    """Per op key, the median over the steps of its traced and priced time; the `top` most traced."""
    keys = {k for step in steps for k in step}
    zero = {"count": 0, "traced_ms": 0.0, "priced_ms": 0.0}
    rows = {
        k: {f: statistics.median(step.get(k, zero)[f] for step in steps) for f in ("count", "traced_ms", "priced_ms")}
        for k in keys
    }
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["traced_ms"])[:top])


def evaluate(directory: Path, model: Any) -> dict[str, Any]:
    traces = load_traces(directory)
    hosts = [t.host for t in traces]
    rows, ops_rank0, op_steps = [], 0, []
    for number in common_steps(traces):
        try:
            steps = steps_for(traces, number)
            found = predict_step(steps, hosts, model)
        except (TraceError, ValueError) as exc:
            rows.append({"step": number, "skipped": str(exc)})
            continue
        traced, rebuilt, predicted = found.traced_s, found.rebuilt_s, found.predicted_s
        ops_rank0 = len(steps[0]["ops"])
        op_steps.append(by_op(found))
        rows.append(
            {
                "step": number,
                "traced_ms": traced * 1e3,
                "rebuilt_ms": rebuilt * 1e3,
                "predicted_ms": predicted * 1e3,
                "rebuilt_error": abs(rebuilt - traced) / traced,
                "error": abs(predicted - traced) / traced,
                "signed": (predicted - traced) / traced,
                "priced_share": found.priced.priced_share,
                "unpriced_ms": {
                    k: v * 1e3 for k, v in sorted(found.priced.unpriced.items(), key=lambda kv: -kv[1])[:6]
                },
            }
        )
    done = [r for r in rows if "error" in r]
    median = lambda key: statistics.median(r[key] for r in done) if done else None  # noqa: E731
    return {
        "steps": rows,
        "traced_ms": median("traced_ms"),
        "predicted_ms": median("predicted_ms"),
        "error": median("error"),
        "signed": median("signed"),
        "rebuilt_error": median("rebuilt_error"),
        "priced_share": median("priced_share"),
        "ops_rank0": ops_rank0,
        "by_op": median_by_op(op_steps) if op_steps else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True, help="MLflow store holding this hardware's champion")
    parser.add_argument("--steps", type=int, default=5, help="profiled (active) steps per job")
    parser.add_argument("--seed", type=int, default=0, help="the DLRM task's seed")
    parser.add_argument("--jobs", default="dlrm,transformer,cnn")
    parser.add_argument(
        "--transformer-spec",
        type=json.loads,
        default=TRANSFORMER_SPEC,
        help="the transformer traced, a spec as JSON (e.g. a task's `spec` in e2e_accuracy_transformer's JSON)",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/trace_prediction.json"))
    args = parser.parse_args()
    from probes.vocabulary.transformer_spec import TransformerSpec

    try:  # a bad spec is named here, before any rank starts (argparse exits 2)
        TransformerSpec.from_dict({**args.transformer_spec, "world_size": WORLD})
    except (TypeError, ValueError) as exc:
        parser.error(f"--transformer-spec: {exc}")

    from orchestrator import registry
    from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

    registry.configure(args.tracking_uri)
    hardware_id = HardwareFingerprint([local_node_fingerprint()]).hardware_id
    model = registry.load_performance_model(args.tracking_uri, hardware_id)
    apply_to_child_processes()  # the ranks allocate as the product's workers do
    results = {}
    for job in args.jobs.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            traces = Path(tmp) / "traces"
            traces.mkdir()
            mp.spawn(
                _rank,
                args=(f"{tmp}/init", str(traces), job, args.steps, args.seed, args.transformer_spec),
                nprocs=WORLD,
            )
            results[job] = evaluate(traces, model)
        r = results[job]
        print(
            f"{job:<12} traced {r['traced_ms']:8.2f} ms  rebuilt error {r['rebuilt_error']:6.1%}  predicted "
            f"{r['predicted_ms']:8.2f} ms  error {r['error']:6.1%} (signed {r['signed']:+.1%})  priced "
            f"{r['priced_share']:.0%} of rank 0's op time",
            flush=True,
        )
    doc = {
        "command": "benchmarks/trace_prediction.py " + " ".join(sys.argv[1:]),
        "hardware_id": hardware_id,
        "world_size": WORLD,
        "transformer_spec": args.transformer_spec,
        "allocator": os.environ.get("GLIBC_TUNABLES", "glibc defaults"),
        "jobs": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

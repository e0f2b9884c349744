"""Where a transformer step's time goes, op by op, timed two ways: at the dispatcher with no
profiler (wall clock around each aten call) and by torch.profiler (the op's traced duration,
as `benchmarks/trace_prediction.py` and the calibration's step captures read it); on one rank
and on two gloo ranks, so what the second rank adds shows apart from what the profiler adds.

    .venv/bin/python benchmarks/step_op_times.py --spec JSON [--worlds 1,2] [--steps 5] [--launches 2]
        [--out PATH]

`--spec`: a transformer spec (e.g. a task's `spec` in e2e_accuracy_transformer's JSON; its
world size is set per run). The ranks run with the product's allocator setting
(`probes.host_allocator`), one thread each. Per world size: the plain step time (no timer),
and per aten op name the milliseconds a step spends in it, each way (rank 0, mean over
`--steps`). The dispatch timer adds a few microseconds a call; the profiler records shapes.
Then the spec on the largest world is launched `--launches` times through the Ray Train
launcher (`orchestrator.launch.launch_transformer`, as the e2e benchmark measures a task): its
iteration time beside the plain step's. Writes benchmarks/results/step_op_times.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from probes.host_allocator import apply_to_child_processes  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402

WARMUP = 5


class DispatchTimer(TorchDispatchMode):
    """Wall-clock seconds per aten op name (the overload dropped), summed over the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds["aten::" + func.__name__.split(".")[0]] += time.perf_counter() - start
        return out


def profiled_ms(prof: Any, steps: int) -> dict[str, float]:
    """Each aten op's self CPU time per step under the profiler (children of an op, as a
    `dropout`'s `bernoulli_`, are counted under their own names, as the dispatch timer does)."""
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages() if e.key.startswith("aten::")}


def _rank(rank: int, world: int, init: str, out: str, spec: dict[str, Any], steps: int) -> None:
    from probes.workloads.transformer import ParallelTransformer

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = ParallelTransformer(TransformerSpec.from_dict({**spec, "world_size": world}), rank, torch.device("cpu"))
        for _ in range(WARMUP):
            model.step()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            model.step()
        step_s = (time.perf_counter() - start) / steps
        dist.barrier()
        timer = DispatchTimer()
        with timer:
            for _ in range(steps):
                model.step()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(steps):
                model.step()
        if rank == 0:
            dispatch = {k: v * 1e3 / steps for k, v in timer.seconds.items()}
            Path(out).write_text(
                json.dumps({"step_ms": step_s * 1e3, "dispatch_ms": dispatch, "profiler_ms": profiled_ms(prof, steps)})
            )
    finally:
        dist.destroy_process_group()


def launched_ms(spec: dict[str, Any], world: int, launches: int) -> list[float]:
    """The spec's iteration time launched `launches` times as a job (local Ray, started here)."""
    if launches < 1:
        return []
    from orchestrator import ray_runtime
    from orchestrator.launch import launch_transformer

    ray_runtime.connect()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            job = TransformerSpec.from_dict({**spec, "world_size": world})
            return [launch_transformer(job, storage=f"{tmp}/ray_results").iteration_ms for _ in range(launches)]
    finally:
        ray_runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=json.loads, required=True, help="a transformer spec as JSON")
    parser.add_argument("--worlds", default="1,2", help="rank counts to run, comma-separated")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--launches", type=int, default=2, help="launches through the Ray Train launcher (0: none)")
    parser.add_argument("--top", type=int, default=16, help="ops printed (by dispatch time on the largest world)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/step_op_times.json"))
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    try:  # a bad spec is named before any rank starts (argparse exits 2)
        for world in worlds:
            TransformerSpec.from_dict({**args.spec, "world_size": world})
    except (TypeError, ValueError) as exc:
        parser.error(f"--spec: {exc}")
    apply_to_child_processes()  # the ranks allocate as the product's workers do
    runs: dict[int, dict[str, Any]] = {}
    for world in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_rank, args=(world, f"{tmp}/init", f"{tmp}/out.json", args.spec, args.steps), nprocs=world)
            runs[world] = json.loads(Path(f"{tmp}/out.json").read_text())
    last = runs[worlds[-1]]
    launched = launched_ms(args.spec, worlds[-1], args.launches)
    print("step ms (no timer, no profiler): " + ", ".join(f"{w} rank(s) {r['step_ms']:.1f}" for w, r in runs.items()))
    if launched:
        print(
            f"launched on {worlds[-1]} rank(s) through the Ray Train launcher: {', '.join(f'{t:.1f}' for t in launched)} ms"
        )
    for op in sorted(last["dispatch_ms"], key=lambda k: -last["dispatch_ms"][k])[: args.top]:
        cells = [
            f"{w}: dispatch {r['dispatch_ms'].get(op, 0.0):6.2f} profiler {r['profiler_ms'].get(op, 0.0):6.2f}"
            for w, r in runs.items()
        ]
        print(f"  {op:34} " + " | ".join(cells))
    for w, r in runs.items():
        print(
            f"  all aten ops, {w} rank(s): dispatch {sum(r['dispatch_ms'].values()):.1f} ms, profiler {sum(r['profiler_ms'].values()):.1f} ms a step"
        )
    doc = {
        "command": "benchmarks/step_op_times.py " + " ".join(sys.argv[1:]),
        "spec": args.spec,
        "steps": args.steps,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

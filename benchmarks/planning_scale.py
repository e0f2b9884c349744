"""Planning at production scale: our planner beside TorchRec's, on the same inputs, one core.

    PYTHONPATH=. .venv/bin/python benchmarks/planning_scale.py [--tables 100 300 1000]
        [--ranks 8 64 512] [--transformer-ranks 8 64 256 1024] [--torchrec-timeout-s 600]
        [--measurements FILE | --tracking-uri URI]

Inputs (issue #28): synthetic DLRM jobs of 100, 300 and 1,000 tables (rows log-uniform over
10^4-10^7, dims 32-128, pooling 1-100, Zipf or uniform ids, 512 samples per rank) on 8, 64 and
512 ranks of 8-GPU nodes with 80 GiB each (H100s), and GPT-style transformer jobs up to 1,024
ranks.

Every planning input runs in a fresh child process pinned to one core
(`os.sched_setaffinity`), one after the other, so the wall times are one core's and the peak
resident memory (`ru_maxrss`) is the planner's own:
- ours: `policies.planning.make_plan` (every sharder, the uniform plans, TorchRec's planner as
  candidates within their budget, the local search), its phases, the candidates it priced and
  the time one candidate's graph build and simulation take;
- TorchRec: `EmbeddingShardingPlanner` with its default settings and constants on the same
  tables, world and per-rank memory (`policies.torchrec_bridge.torchrec_plan`), killed after
  `--torchrec-timeout-s`; its plan priced afterwards by our predictor (not timed);
- transformers: `make_transformer_plan` (every layout priced), then one iteration of the
  chosen layout and of the job's largest pipeline built and simulated as the planner does
  (the ranks that stand for the others), and, where it fits in memory (no micro-batches or
  pipeline), as the whole world.

The performance model: kernels fitted to real measurements of this hardware (the champion at
`--tracking-uri`, else the committed calibration rows of `--measurements`); the collectives of
8-, 64- and 512-rank groups were never measured here, so their curves are fitted to rows
computed from the dgx-h100-400g preset (NVLink ring inside a node, a 400 Gb/s NIC per GPU
across), which the JSON says. This measures planning time, not prediction accuracy.

Prints a table and writes benchmarks/results/planning_scale.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_MEASUREMENTS = REPO / "benchmarks/results/e2e_issue26_20261126/measurements_0011.jsonl.gz"
OUT = REPO / "benchmarks/results/planning_scale.json"
GPUS_PER_NODE = 8
DEVICE_MEMORY = 80 * 2**30
CLUSTER = "dgx-h100-400g"
COLLECTIVES = ("all_reduce", "all_to_all", "reduce_scatter", "all_gather", "broadcast")


# -- inputs ---------------------------------------------------------------------------------


def dlrm_job(tables: int, ranks: int, seed: int = 0) -> dict[str, Any]:
    """A production-shaped DLRM: the issue's table spread, DLRM-paper-sized MLPs."""
    rng = np.random.default_rng([seed, tables, ranks])
    specs = []
    for j in range(tables):
        specs.append(
            {
                "name": f"t{j}",
                "num_embeddings": int(np.exp(rng.uniform(np.log(1e4), np.log(1e7)))),
                "embedding_dim": int(rng.choice([32, 64, 96, 128])),
                "pooling_factor": int(np.clip(round(np.exp(rng.uniform(0, np.log(100)))), 1, 100)),
                "distribution": {"zipf": round(float(rng.uniform(0.6, 1.2)), 2)} if rng.random() < 0.5 else "uniform",
            }
        )
    return {
        "name": f"dlrm{tables}x{ranks}",
        "workload": "dlrm",
        "world_size": ranks,
        "batch_size": 512,
        "seed": seed,
        "dense": {"num_dense_features": 13, "bottom_mlp": [512, 256, 128], "top_mlp": [1024, 1024, 512, 256, 1]},
        "tables": specs,
    }


def transformer_job(ranks: int) -> dict[str, Any]:
    """A GPT-3 13B-shaped job: 40 blocks of hidden 5120, 2,048 tokens, 2 sequences per rank."""
    return {
        "name": f"gpt13b-{ranks}",
        "workload": "transformer",
        "world_size": ranks,
        "layers": 40,
        "hidden": 5120,
        "heads": 40,
        "seq_len": 2048,
        "vocab_size": 0,
        "global_batch": 2 * ranks,
        "dtype": "bfloat16",
        "seed": 0,
    }


@dataclass
class DeviceNode:
    node_id: str

    def label(self) -> str:
        return f"{GPUS_PER_NODE}x H100 (80 GiB)"


@dataclass
class Cluster:
    """The planning view of `nodes` 8-GPU nodes (`policies.planning.Hardware`)."""

    nodes: int
    hardware_id: str = "planning-scale"
    device_nodes: list[DeviceNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.device_nodes = [DeviceNode(f"node{i}") for i in range(self.nodes)]

    @property
    def devices_per_node(self) -> list[int]:
        return [GPUS_PER_NODE] * self.nodes

    @property
    def min_device_memory_bytes(self) -> int:
        return DEVICE_MEMORY


# -- the model ------------------------------------------------------------------------------


def preset_collective_rows(worlds: list[int]) -> list:
    """Rows of the preset cluster's collectives for every group a job here may form (each
    power of two up to the largest world, within a node up to 8, across nodes from 2): a ring
    over the slowest dimension the group crosses (per step its latency, (W-1)/W of the bytes
    over its bandwidth; all-reduce twice that; a broadcast, which prices pipeline transfers,
    the bytes once)."""
    from predictors.network import GPU_CLUSTERS
    from probes.vocabulary.ops import collective_params
    from probes.vocabulary.records import Measurement

    nvlink_gbs, nvlink_us, nic_gbit, nic_us = GPU_CLUSTERS[CLUSTER]
    largest = int(math.log2(max(worlds)))
    groups = [(2**k, "intra") for k in range(1, 4)] + [(2**k, "inter") for k in range(1, largest + 1)]
    rows = []
    for world, scope in groups:
        bandwidth = (nvlink_gbs if scope == "intra" else nic_gbit / 8) * 1e9
        latency = (nvlink_us if scope == "intra" else nic_us) * 1e-6
        for op in COLLECTIVES:
            for log2 in range(3, 34):
                nbytes = 2**log2
                share = 1.0 if op == "broadcast" else (world - 1) / world * (2 if op == "all_reduce" else 1)
                t = (world - 1) * latency + share * nbytes / bandwidth
                params = collective_params(op, nbytes, world, scope)
                rows.append(Measurement(op, params, t, 0.0, 5, family="collective"))
    return rows


def measured_rows(path: Path) -> list:
    from predictors.fit import kernel_rows
    from probes.vocabulary.records import Measurement

    with gzip.open(path, "rt") as f:
        rows = [Measurement.from_row(json.loads(line)) for line in f if line.strip()]
    return [r for r in kernel_rows(rows) if r.family != "collective"]


def build_model(args: argparse.Namespace, worlds: list[int], directory: Path) -> dict[str, Any]:
    """Fit the kernels and the preset collectives into one bundle saved under `directory`."""
    from predictors.fit import fit_performance_model

    if args.tracking_uri:
        from orchestrator import registry

        champion = registry.load_performance_model(args.tracking_uri, args.hardware_id)
        kernels = {op: m for op, m in champion.models.items() if op not in COLLECTIVES}
        source = f"champion at {args.tracking_uri}"
        model, _ = fit_performance_model(preset_collective_rows(worlds), champion.hardware_id)
        model.models.update(kernels)
        model.dispatch = champion.dispatch
    else:
        rows = measured_rows(Path(args.measurements)) + preset_collective_rows(worlds)
        model, _ = fit_performance_model(rows, "planning-scale")
        source = os.path.relpath(args.measurements, REPO)
    model.save(directory)
    return {"kernels_from": source, "collectives_from": f"preset {CLUSTER} (computed rows, not measured)"}


# -- the children ---------------------------------------------------------------------------


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_ours(job: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    from policies.planning import make_plan
    from policies.sharders import NoFeasiblePlanError
    from predictors.dlrm_graph import build_dlrm_graph
    from predictors.performance_model import PerformanceModel
    from predictors.simulator import model_cost, model_cpu_overhead, simulate
    from probes.vocabulary.jobspec import JobSpec

    model = PerformanceModel.load_dir(model_dir)
    spec = JobSpec.from_dict(job)
    cluster = Cluster(math.ceil(spec.world_size / GPUS_PER_NODE))
    t0 = time.perf_counter()
    try:
        plan = make_plan(spec, model, cluster, None)
    except NoFeasiblePlanError as exc:  # the tables need more memory than the ranks have: an answer too
        reasons = str(exc).splitlines()
        return {"plan_s": time.perf_counter() - t0, "feasible": False, "reason": reasons[0], "refused": reasons[1:]}
    wall = time.perf_counter() - t0
    sharding = plan.decisions["sharding"]
    candidates = {c.name: c.predicted_ms for c in sharding.candidates}
    search = next((c.detail.get("search") for c in sharding.candidates if c.detail.get("search")), {})
    placement = plan.rank_placement
    t1 = time.perf_counter()
    graph = build_dlrm_graph(spec, plan.table_to_rank, placement)
    built = time.perf_counter() - t1
    t2 = time.perf_counter()
    simulate(graph, model_cost(model, set()), cpu_overhead=model_cpu_overhead(model), synchronous=model.synchronous)
    simulated = time.perf_counter() - t2
    return {
        "plan_s": wall,
        "predicted_ms": plan.predicted_iteration_ms,
        "chosen": sharding.choice,
        "candidates_ms": candidates,
        "refused": {c.name: c.detail.get("reason") for c in sharding.candidates if not c.feasible},
        "search": {k: search.get(k) for k in ("evaluations", "seconds", "exhausted", "started_from")},
        "graph_build_s": built,
        "simulate_s": simulated,
        "graph_ops": sum(len(ops) for ops in graph.ranks),
        "peak_rss_mb": peak_rss_mb(),
    }


def child_torchrec(job: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    from policies.planning import memory_cap_bytes
    from policies.sharders import NoFeasiblePlanError
    from policies.sharding import PlanPricer
    from policies.torchrec_bridge import torchrec_plan
    from predictors.performance_model import PerformanceModel
    from probes.vocabulary.jobspec import JobSpec
    from probes.vocabulary.placement import RankPlacement

    spec = JobSpec.from_dict(job)
    cluster = Cluster(math.ceil(spec.world_size / GPUS_PER_NODE))
    placement = RankPlacement.packed(spec.world_size, cluster.devices_per_node)
    cap = memory_cap_bytes(spec, cluster)
    t0 = time.perf_counter()
    try:
        entries = torchrec_plan(spec, cap, placement=placement)
    except NoFeasiblePlanError as exc:
        return {"plan_s": time.perf_counter() - t0, "refused": str(exc), "peak_rss_mb": peak_rss_mb()}
    wall = time.perf_counter() - t0
    rss = peak_rss_mb()
    model = PerformanceModel.load_dir(model_dir)
    priced = PlanPricer(spec, model, cap, DEVICE_MEMORY, placement)("torchrec", list(entries))
    return {
        "plan_s": wall,
        "predicted_ms": priced.predicted_ms,
        "feasible_for_us": priced.feasible,
        "reason": priced.detail.get("reason"),
        "peak_rss_mb": rss,
    }


def child_transformer(job: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    from policies.parallelism import enumerate_layouts
    from policies.planning import make_transformer_plan
    from predictors.performance_model import PerformanceModel
    from predictors.simulator import model_cost, model_cpu_overhead, simulate
    from predictors.transformer_graph import build_transformer_graph
    from probes.vocabulary.placement import RankPlacement
    from probes.vocabulary.transformer_job import TransformerJob
    from probes.vocabulary.transformer_spec import TransformerSpec

    model = PerformanceModel.load_dir(model_dir)
    tjob = TransformerJob.from_dict(job)
    cluster = Cluster(math.ceil(tjob.world_size / GPUS_PER_NODE))
    t0 = time.perf_counter()
    plan = make_transformer_plan(tjob, model, cluster, None)
    wall = time.perf_counter() - t0
    parallelism = plan.decisions["parallelism"]
    spec = TransformerSpec.from_dict(parallelism.choice_detail["layout"])
    placement = RankPlacement.packed(tjob.world_size, cluster.devices_per_node)
    cost, overhead = model_cost(model, set()), model_cpu_overhead(model)
    # besides the chosen layout, the largest pipeline the job allows (most ranks per replica,
    # most micro-batches): the iteration the planner's simulation finds hardest
    piped = [s for s in enumerate_layouts(tjob) if s.pipeline_parallel > 1]
    hardest = max(piped, key=lambda s: (s.tensor_parallel * s.pipeline_parallel, s.micro_batches), default=None)
    timed: dict[str, dict[str, Any]] = {}
    for label, layout in (("chosen", spec), ("pipeline", hardest)):
        if layout is None:
            continue
        # a 1,024-rank layout's whole world of micro-batches or pipeline stages does not fit
        # this host's memory (over 20 GiB built); its ranks are alike, and the planner
        # simulates the few that stand for them
        for fold in (True, False) if layout.pipeline_parallel == 1 and layout.micro_batches == 1 else (True,):
            t1 = time.perf_counter()
            graph = build_transformer_graph(layout, placement, fold=fold)
            built = time.perf_counter() - t1
            t2 = time.perf_counter()
            result = simulate(graph, cost, cpu_overhead=overhead, synchronous=model.synchronous)
            timed[f"{label}_{'folded' if fold else 'whole'}"] = {
                "layout": layout.layout,
                "graph_build_s": built,
                "simulate_s": time.perf_counter() - t2,
                "graph_ranks": graph.world_size,
                "graph_ops": sum(len(ops) for ops in graph.ranks),
                "iteration_ms": result.iteration_s * 1e3,
            }
    return {
        "plan_s": wall,
        "layouts_priced": parallelism.choice_detail.get("priced"),
        "chosen": parallelism.choice,
        "predicted_ms": plan.predicted_iteration_ms,
        # one iteration of the chosen layout as the planner simulates it (one rank, or one
        # replica of a pipeline: the same iteration as the whole world's,
        # tests/test_planning_scale.py); in `iteration` also the whole world where it fits
        "graph_build_s": timed["chosen_folded"]["graph_build_s"],
        "simulate_s": timed["chosen_folded"]["simulate_s"],
        "graph_ops": timed["chosen_folded"]["graph_ops"],
        "iteration": timed,
        "peak_rss_mb": peak_rss_mb(),
    }


CHILDREN = {"ours": child_ours, "torchrec": child_torchrec, "transformer": child_transformer}


def run_child(kind: str, job: dict[str, Any], model_dir: Path, timeout_s: float) -> dict[str, Any]:
    """One planning input in a fresh process on one core; a child past `timeout_s` is killed
    and reported as not finished."""
    with tempfile.TemporaryDirectory() as tmp:
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job))
        out = Path(tmp) / "out.json"
        command = [sys.executable, __file__, "--child", kind, str(job_file), str(model_dir), str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        started = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, timeout=timeout_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"finished": False, "timeout_s": timeout_s, "elapsed_s": time.perf_counter() - started}
        if done.returncode != 0 or not out.exists():
            return {"finished": False, "returncode": done.returncode, "error": done.stderr.strip().splitlines()[-5:]}
        return {"finished": True, **json.loads(out.read_text())}


def child_main(kind: str, job_file: str, model_dir: str, out: str) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    torch.set_num_threads(1)
    result = CHILDREN[kind](json.loads(Path(job_file).read_text()), Path(model_dir))
    Path(out).write_text(json.dumps(result))


# -- the run --------------------------------------------------------------------------------


def seconds(result: dict[str, Any]) -> str:
    if result.get("feasible") is False:
        return f"{result['plan_s']:.1f} no plan"
    if result.get("finished"):
        return f"{result['plan_s']:.1f}"
    if "timeout_s" in result:
        return f">{result['timeout_s']:.0f} (killed)"
    return "error"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, nargs="*", default=[100, 300, 1000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--transformer-ranks", type=int, nargs="*", default=[8, 64, 256, 1024])
    parser.add_argument("--torchrec-timeout-s", type=float, default=600.0, help="kill TorchRec's planner after this")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="kill our planner after this")
    parser.add_argument("--measurements", default=str(DEFAULT_MEASUREMENTS), help="calibration rows (jsonl.gz)")
    parser.add_argument("--tracking-uri", help="use this store's champion's kernels instead of --measurements")
    parser.add_argument("--hardware-id", help="whose champion, with --tracking-uri")
    parser.add_argument("--model-dir", help="keep the fitted bundle here and reuse it when present")
    parser.add_argument("--no-torchrec", action="store_true", help="time our planner only")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--child", nargs=4, metavar=("KIND", "JOB", "MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return

    worlds = sorted(set(args.ranks) | set(args.transformer_ranks) | {2, 4, 8})
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir or scratch
        t0 = time.perf_counter()
        source_file = Path(model_dir) / "source.json"
        if source_file.exists():
            source = json.loads(source_file.read_text())
        else:
            source = build_model(args, worlds, Path(model_dir))
            source_file.write_text(json.dumps(source))
        print(f"model ready in {time.perf_counter() - t0:.1f} s: kernels from {source['kernels_from']}")
        dlrm: list[dict[str, Any]] = []
        transformers: list[dict[str, Any]] = []

        def save() -> None:
            """Written after every input, so a run cut short keeps what it measured."""
            out = {
                "command": "python benchmarks/planning_scale.py " + " ".join(sys.argv[1:]),
                "cpu": "one core (sched_setaffinity), torch threads 1",
                "model": source,
                "device_memory_gib": DEVICE_MEMORY / 2**30,
                "dlrm": dlrm,
                "transformer": transformers,
            }
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=1))

        for ranks in args.transformer_ranks:
            result = run_child("transformer", transformer_job(ranks), Path(model_dir), args.timeout_s)
            transformers.append({"ranks": ranks, **result})
            save()
            print(
                f"transformer {ranks:>5} ranks: plan {seconds(result)} s over {result.get('layouts_priced')} layouts, "
                f"chose {result.get('chosen')}",
                flush=True,
            )
            for label, t in (result.get("iteration") or {}).items():
                print(
                    f"  {label:>16} {t['layout']:>20}: {t['graph_ranks']:>5} ranks, {t['graph_ops']:>8} ops, "
                    f"build {t['graph_build_s']:.3f} s + simulate {t['simulate_s']:.3f} s = {t['iteration_ms']:.2f} ms",
                    flush=True,
                )
        if args.tables:
            print(
                f"{'tables':>6} {'ranks':>5} | {'ours s':>8} {'search':>7} {'build s':>7} {'sim s':>6} {'MiB':>6} "
                f"{'pred ms':>8} | {'TorchRec s':>14} {'pred ms':>8} {'MiB':>6}"
            )
        for tables in args.tables:
            for ranks in args.ranks:
                job = dlrm_job(tables, ranks)
                ours = run_child("ours", job, Path(model_dir), args.timeout_s)
                theirs = (
                    {} if args.no_torchrec else run_child("torchrec", job, Path(model_dir), args.torchrec_timeout_s)
                )
                row = {"tables": tables, "ranks": ranks, "ours": ours, "torchrec": theirs}
                if ours.get("finished") and theirs.get("finished"):
                    row["ours_over_torchrec_time"] = ours["plan_s"] / theirs["plan_s"]
                dlrm.append(row)
                save()
                search = ours.get("search") or {}
                print(
                    f"{tables:>6} {ranks:>5} | {seconds(ours):>8} {search.get('evaluations') or '-':>7} "
                    f"{ours.get('graph_build_s', float('nan')):>7.3f} {ours.get('simulate_s', float('nan')):>6.3f} "
                    f"{ours.get('peak_rss_mb', float('nan')):>6.0f} {ours.get('predicted_ms') or float('nan'):>8.2f} | "
                    f"{seconds(theirs) if theirs else '-':>14} {theirs.get('predicted_ms') or float('nan'):>8.2f} "
                    f"{theirs.get('peak_rss_mb', float('nan')):>6.0f}",
                    flush=True,
                )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

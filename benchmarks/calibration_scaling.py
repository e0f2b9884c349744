"""Calibration scaling: does adding a node make the probe sweep faster per measurement?

    PYTHONPATH=. .venv/bin/python benchmarks/calibration_scaling.py [--local-points 600] [--seed 0]

The same fixed list of local probe points (GEMM, embedding and element-wise, interleaved as
calibration interleaves them) is run through `orchestrator.fanout.run_local_probes` on a fresh
`ray.cluster_utils.Cluster` of 1, 2 and 3 simulated nodes, each node with one CPU (one
probe slot), the `ActorPool` in a SPREAD placement group exactly as `calibrate.measure` builds
it. For each configuration it reports the sweep's wall time (cluster and pool start-up
reported separately, not counted), points measured / failed, rows written, measurements per
second, and the node each actor landed on (every node must be used); and the calibration-cost
ratio: the sweep's wall time over the time the probes themselves took per device (each row's
`probe_s`, stamped by the actor that measured it), 1.0 if nothing but probes ran. This
machine has two cores, so the third node's actor shares a core with another.
With 2 nodes a small inter-node collective sweep (`run_collective_probes` on a gang of both
actors) is also run and reported on its own, as it has no 1-node counterpart.

The requirement: with 2 nodes the sweep must not be slower per measurement than with 1
(`not_slower`, from `speedup_per_measurement` = s/point on 1 node / s/point on 2 nodes).
The simulated nodes share this machine, so 2 one-CPU nodes use both of its cores; Ray's own
processes (GCS, two raylets, the driver) compete with the probes for them. The geometric
mean ratio of each point's measured median (2 nodes / 1 node) is reported too, to show how
much that sharing moves the measurements themselves.

Prints a table and writes benchmarks/results/calibration_scaling_<hardware_id>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TQDM_DISABLE", "1")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint  # noqa: E402
from orchestrator.fanout import Phase, run_collective_probes, run_local_probes  # noqa: E402
from orchestrator.measurement_store import MeasurementStore  # noqa: E402
from orchestrator.probe_pool import ActorPool  # noqa: E402
from orchestrator.ray_runtime import set_worker_niceness  # noqa: E402
from probes.collective_sweep import collective_groups, collective_specs  # noqa: E402
from probes.embedding import embedding_specs  # noqa: E402
from probes.gemm import gemm_specs  # noqa: E402
from probes.probe import ProbeSpec  # noqa: E402
from probes.sweep import interleave  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402

try:  # element-wise points join the sweep where the probe family exists
    from probes.elementwise import elementwise_specs
except ImportError:  # pragma: no cover - older trees
    elementwise_specs = None

NODE_CONFIGS = {"1_node": 1, "2_nodes": 2, "3_nodes": 3}
OBJECT_STORE_BYTES = 256 * 2**20  # per simulated node; probes return small records
COLLECTIVE_MAX_BYTES = 2**20


def local_specs(points: int, seed: int) -> list[ProbeSpec]:
    """`points` local probe points split evenly over the available families, interleaved."""
    families = [lambda n: gemm_specs(n, seed), lambda n: embedding_specs(n, seed)]
    if elementwise_specs is not None:
        families.append(lambda n: elementwise_specs(n, seed))
    base, extra = divmod(points, len(families))
    return interleave(*(make(base + (i < extra)) for i, make in enumerate(families)))


def collective_sweep(nodes: Sequence[str], points: int) -> list[ProbeSpec]:
    """The first `points` collective points (coarse-to-fine sizes) on the rank groups calibration uses."""
    return collective_specs(collective_groups(nodes), COLLECTIVE_MAX_BYTES, per_octave=1)[:points]


def start_cluster(num_nodes: int) -> Cluster:
    """A head node plus `num_nodes - 1` workers, one CPU each, and this driver connected to it."""
    node_args = {"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES}
    set_worker_niceness()  # as the product's own clusters run their workers
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    for _ in range(num_nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


def timed_sweep(run: Any, pool: ActorPool, specs: Sequence[ProbeSpec], directory: Path) -> dict[str, Any]:
    """Run `specs` with `run` (local or collective fan-out) into a fresh store; wall time and counts."""
    store = MeasurementStore(directory)
    t0 = time.perf_counter()
    done, failed = run(Phase(pool, specs, store, math.inf))
    wall = time.perf_counter() - t0
    rows = store.rows()
    probe_s = sum(float(r.extra.get("probe_s", 0.0)) for r in rows)  # time spent inside the probes
    devices = len(pool.nodes())
    return {
        "points": len(specs),
        "done": done,
        "failed": failed,
        "rows": len(rows),
        "rows_per_family": dict(sorted(Counter(r.family for r in rows).items())),
        "wall_s": round(wall, 3),
        "s_per_measurement": round(wall / done, 5) if done else None,
        "measurements_per_s": round(done / wall, 3) if wall > 0 else None,
        "probe_s": round(probe_s, 3),
        # wall time over the probes' own time per device: 1.0 if nothing but probes ran
        "cost_ratio": round(wall / (probe_s / devices), 3) if probe_s > 0 else None,
        "failures": [f["error"] for f in store.failures()][:5],
        "_rows": rows,
    }


def run_config(
    num_nodes: int, specs: Sequence[ProbeSpec], hardware_id: str, collective_points: int, scratch: Path
) -> dict[str, Any]:
    """One configuration: fresh cluster, pool of one actor per node, the local sweep (and collectives)."""
    t0 = time.perf_counter()
    cluster = start_cluster(num_nodes)
    try:
        cluster_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        pool = ActorPool("cpu", hardware_id, num_nodes, strategy="SPREAD").start()
        pool_s = time.perf_counter() - t1
        try:
            actor_nodes = pool.nodes()
            result: dict[str, Any] = {
                "nodes": num_nodes,
                "cluster_nodes": sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive")),
                "actor_nodes": actor_nodes,
                "distinct_actor_nodes": len(set(actor_nodes)),
                "startup_s": {"cluster": round(cluster_s, 2), "actor_pool": round(pool_s, 2)},
                "local": timed_sweep(run_local_probes, pool, specs, scratch / f"{num_nodes}n-local"),
            }
            if num_nodes > 1 and collective_points > 0:
                coll = collective_sweep(actor_nodes, collective_points)
                result["collective"] = timed_sweep(run_collective_probes, pool, coll, scratch / f"{num_nodes}n-coll")
                result["collective"]["scopes"] = sorted(
                    {r.params.get("scope", "") for r in result["collective"]["_rows"]}
                )
            result["replaced_actors"] = pool.replaced
        finally:
            pool.stop()
    finally:
        stop_cluster(cluster)
    return result


def median_ratio(a: list[Measurement], b: list[Measurement]) -> dict[str, Any]:
    """Geometric mean of b's median / a's median over the rows both runs measured."""

    def index(rows: list[Measurement]) -> dict[tuple[str, str], float]:
        return {(r.op, json.dumps(r.params, sort_keys=True)): r.median_s for r in rows if r.median_s > 0}

    ia, ib = index(a), index(b)
    common = sorted(set(ia) & set(ib))
    if not common:
        return {"n": 0, "geomean": None}
    logs = [math.log(ib[k] / ia[k]) for k in common]
    return {"n": len(common), "geomean": round(math.exp(sum(logs) / len(logs)), 4)}


def summarize(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    one, two = configs["1_node"]["local"], configs["2_nodes"]["local"]
    speedup = one["s_per_measurement"] / two["s_per_measurement"] if one["done"] and two["done"] else None
    return {
        "speedup_per_measurement": round(speedup, 3) if speedup is not None else None,
        "not_slower": bool(speedup is not None and speedup >= 1.0 and configs["2_nodes"]["distinct_actor_nodes"] == 2),
        "median_ratio_2_vs_1": median_ratio(one["_rows"], two["_rows"]),
        "measurements_per_s": {name: c["local"]["measurements_per_s"] for name, c in configs.items()},
        "cost_ratio": {name: c["local"]["cost_ratio"] for name, c in configs.items()},
    }


def strip_rows(value: Any) -> Any:
    """The result without the raw rows kept for comparison."""
    if isinstance(value, dict):
        return {k: strip_rows(v) for k, v in value.items() if k != "_rows"}
    return value


def print_table(result: dict[str, Any]) -> None:
    print(f"hardware {result['hardware_id']}  local points {result['local_points']}  seed {result['seed']}")
    print(
        f"{'config':8s} {'actors@nodes':>12s} {'startup s':>10s} {'done':>6s} {'failed':>6s} {'rows':>6s} "
        f"{'wall s':>8s} {'meas/s':>7s} {'probe s':>8s} {'cost':>6s}"
    )
    for name, c in result["configs"].items():
        loc = c["local"]
        startup = c["startup_s"]["cluster"] + c["startup_s"]["actor_pool"]
        print(
            f"{name:8s} {len(c['actor_nodes']):>5d}@{c['distinct_actor_nodes']:<6d} {startup:10.1f} {loc['done']:6d} "
            f"{loc['failed']:6d} {loc['rows']:6d} {loc['wall_s']:8.1f} {loc['measurements_per_s']:7.2f} "
            f"{loc['probe_s']:8.1f} {loc['cost_ratio']:6.2f}"
        )
    coll = result["configs"]["2_nodes"].get("collective")
    if coll:
        print(
            f"2-node collectives ({', '.join(coll['scopes'])}): {coll['done']} done, {coll['failed']} failed, "
            f"{coll['wall_s']:.1f}s, {coll['s_per_measurement']}s per measurement"
        )
    ratio = result["median_ratio_2_vs_1"]
    print(
        f"speedup per measurement (1 node / 2 nodes): {result['speedup_per_measurement']}  "
        f"not slower: {result['not_slower']}  measured-median ratio 2/1: {ratio['geomean']} over {ratio['n']} rows"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-points", type=int, default=600, help="local probe points per configuration")
    parser.add_argument("--collective-points", type=int, default=24, help="collective points on 2 nodes (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks/results"))
    args = parser.parse_args(argv)

    hardware_id = HardwareFingerprint([local_node_fingerprint()]).hardware_id
    specs = local_specs(args.local_points, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            name: run_config(n, specs, hardware_id, args.collective_points, Path(tmp))
            for name, n in NODE_CONFIGS.items()
        }
    result = {
        "hardware_id": hardware_id,
        "command": "python benchmarks/calibration_scaling.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out_dir"),
        "local_points": len(specs),
        "local_families": dict(sorted(Counter(s.family for s in specs).items())),
        "seed": args.seed,
        **summarize(configs),
        "configs": strip_rows(configs),
    }
    out = Path(args.out_dir) / f"calibration_scaling_{hardware_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print_table(result)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()

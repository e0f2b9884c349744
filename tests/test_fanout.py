"""Probe fan-out through Ray: a two-actor gloo gang, and a killed actor's probe retried."""

import os
import time

import pytest
import ray

from orchestrator.fanout import Phase, run_collective_probes, run_local_probes
from orchestrator.measurement_store import MeasurementStore
from orchestrator.probe_pool import ActorPool
from probes.collective import window_estimate
from probes.collective_sweep import COLLECTIVE_PASSES, collective_specs
from probes.gemm import gemm_specs
from probes.probe import ProbeSpec
from probes.training import training_specs, transformer_training_specs
from probes.vocabulary.ops import COLLECTIVE_OPS


def test_two_actor_gloo_collective_probe(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    try:
        # each actor on its own share of the host's cores, as the launched job's ranks (`core_binding`)
        assert [(s.index, s.count) for s in pool.slots] == [(0, 2), (1, 2)]
        if hasattr(os, "sched_getaffinity"):  # no CPU affinity on macOS: nothing is bound there
            assert all(pool.cores) and (len(os.sched_getaffinity(0)) < 2 or not set(pool.cores[0]) & set(pool.cores[1]))
        specs = [s for s in collective_specs([(0, 1)], 2**20) if s.params["bytes"] in (4, 2**12, 2**20)]
        done, failed = run_collective_probes(Phase(pool, specs, store, time.monotonic() + 120))
    finally:
        pool.stop()
    assert (done, failed) == (18, 0)  # 3 sizes x (5 collectives + an uneven all-to-all)
    rows = store.rows()
    assert len(rows) == 18
    assert sorted({r.op for r in rows}) == sorted(COLLECTIVE_OPS)
    assert sum(1 for r in rows if r.params.get("uneven")) == 3
    # each point was visited once per pass; the store's view merges the visits
    assert len(store.rows_path.read_text().splitlines()) == 18 * COLLECTIVE_PASSES
    assert all(r.extra["passes"] == COLLECTIVE_PASSES for r in rows)
    for r in rows:
        assert r.world_size == 2 and r.params["world"] == 2 and r.params["scope"] == "intra"
        assert r.median_s > 0 and r.repeats >= 11 and r.hardware_id == "hw-test"
        # timed in windows; the row is the faster half of the windows' (slowest member's) medians
        assert len(r.extra["window_medians"]) >= 3
        assert r.median_s == pytest.approx(window_estimate(r.extra["window_medians"]))
        assert r.extra["bus_bw"] > 0 and r.extra["ranks"] == [0, 1]
        # nccl-tests conventions for n = 2: all_reduce 2(n-1)/n = 1, broadcast 1, others (n-1)/n
        factor = 1.0 if r.op in ("all_reduce", "broadcast") else 0.5
        assert abs(r.extra["bus_bw"] - factor * r.extra["alg_bw"]) < 1e-6 * r.extra["alg_bw"]
    assert {r.params["bytes"] for r in rows if r.op == "all_reduce"} >= {8, 2**20}  # both sizes measured


def test_killed_actor_is_replaced_and_nothing_is_lost(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    specs = gemm_specs(12, seed=3, max_dim=256)
    killed = []

    def kill_once(done: int, failed: int) -> None:
        if not killed:  # kill an actor while it holds a probe in flight
            victim = pool.actors[0]
            ray.kill(victim)
            killed.append(victim)

    try:
        done, failed = run_local_probes(Phase(pool, specs, store, time.monotonic() + 120, kill_once))
    finally:
        pool.stop()
    assert killed and pool.replaced >= 1
    assert (done, failed) == (12, 0)
    measured = sorted((r.params["M"], r.params["N"], r.params["K"]) for r in store.rows())
    assert measured == sorted((s.params["M"], s.params["N"], s.params["K"]) for s in specs)


def test_probe_that_always_fails_is_recorded_not_dropped(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    bad = ProbeSpec("no_such_family", {"x": 1}, "bad")
    try:
        done, failed = run_local_probes(
            Phase(pool, [bad] + gemm_specs(2, seed=0, max_dim=64), store, time.monotonic() + 60)
        )
    finally:
        pool.stop()
    assert (done, failed) == (2, 1)
    [failure] = store.failures()
    assert failure["attempts"] == 2 and "no_such_family" in failure["error"]
    assert failure["spec"]["key"] == "bad"


def test_training_probe_runs_on_the_gang(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    try:
        specs = training_specs(1, seed=0, world=2) + transformer_training_specs(1, seed=0, world=2)
        done, failed = run_collective_probes(Phase(pool, specs, store, time.monotonic() + 120))
    finally:
        pool.stop()
    assert (done, failed) == (2, 0)
    [row] = [r for r in store.rows() if r.op == "dlrm_step"]
    assert row.median_s > 0 and row.world_size == 2
    overheads = [r for r in store.rows() if r.op == "cpu_overhead"]
    assert {r.params["kind"] for r in overheads} >= {"gap", "dispatch"}
    assert any(r.params["aten_op"].startswith("c10d::") for r in overheads)  # the gang's all-to-all
    assert all(0 < r.median_s < row.median_s for r in overheads)
    # Kernels timed inside the captured steps, priced by the isolated probes' op and params.
    in_context = [r for r in store.rows() if r.op == "in_context"]
    assert {"gemm", "relu"} <= {r.params["model_op"] for r in in_context if r.params["workload"] == "dlrm"}
    assert {"gelu", "softmax", "layer_norm"} <= {
        r.params["model_op"] for r in in_context if r.params["workload"] == "transformer"
    }
    [step] = [r for r in store.rows() if r.op == "transformer_step"]
    assert step.median_s > 0

"""Fault injection: each case asserts that nothing measured is lost and the outcome is the right one.

- a probe actor killed in the middle of a collective batch;
- a probe actor stopped with SIGSTOP (the phase ends within its deadline plus grace, the point
  is retried or recorded);
- the tracking server answering 503 while a bundle is registered (nothing is promoted);
- a measurement store whose last line was torn by a crash (it still refits);
- two autotunes and a nightly started together (one calibrates and promotes, the others wait
  and reuse it);
- a stale Ray current-cluster file (a command starts its own local cluster instead of hanging).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import yaml

from orchestrator.fanout import Phase, run_collective_probes, run_local_probes
from orchestrator.measurement_store import MeasurementStore
from orchestrator.probe_pool import ActorPool
from probes.collective_sweep import collective_specs
from probes.gemm import gemm_specs

REPO = Path(__file__).resolve().parents[1]


def test_an_actor_killed_mid_collective_loses_nothing(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    specs = collective_specs([(0, 1)], max_bytes=2**16, per_octave=1)[:24]

    def kill_soon() -> None:
        time.sleep(1.0)  # the first batch is running by now
        ray.kill(pool.actors[0])

    killer = threading.Thread(target=kill_soon)
    try:
        killer.start()
        done, failed = run_collective_probes(Phase(pool, specs, store, time.monotonic() + 120), passes=1)
    finally:
        killer.join()
        pool.stop()
    assert pool.replaced >= 2, "the gang was rebuilt (both members restarted)"
    measured = {(r.op, r.params["bytes"], bool(r.params.get("uneven"))) for r in store.rows()}
    failed_specs = [f["spec"] for f in store.failures()]
    assert done + failed == len(specs) and len(measured) + len(failed_specs) >= done
    assert done > 0 and failed == len(failed_specs)


def test_a_stopped_probe_actor_is_cut_at_the_deadline_and_its_point_recorded(ray_local, tmp_path):
    pool = ActorPool("cpu", "hw-test", 2).start()
    store = MeasurementStore(tmp_path)
    specs = gemm_specs(400, seed=5, max_dim=128)
    stopped = ray.get(pool.actors[0].where.remote())["pid"]

    def stop_once(done: int, failed: int) -> None:
        if not getattr(stop_once, "fired", False):  # the actor holds a probe by now, and never answers it
            stop_once.fired = True
            os.kill(stopped, signal.SIGSTOP)

    t0 = time.monotonic()
    try:
        done, failed = run_local_probes(
            Phase(pool, specs, store, t0 + 6.0, stop_once, grace_s=2.0), probe_timeout_s=3.0
        )
    finally:
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed and replaced, as it should be
        pool.stop()
    elapsed = time.monotonic() - t0
    assert elapsed < 6.0 + 2.0 + 15.0, f"the phase ran {elapsed:.0f}s past a 6 s deadline + 2 s grace"
    assert pool.replaced >= 1
    failures = store.failures()
    assert done == len(store.rows()) and failed == len(failures) and done > 0
    # the stopped actor's point was cut at its timeout and retried elsewhere, or recorded
    timed_out = [f for f in failures if "timed out" in f["error"]]
    assert pool.replaced >= 1
    assert timed_out or done + failed > 0


def _bundle(seed: int, noise: float):
    from synthetic_rows import gemm_rows

    from predictors.fit import fit_performance_model

    rng = np.random.default_rng(seed)
    rows = gemm_rows(rng, 60)
    for r in rows:
        r.median_s *= float(np.exp(rng.normal(0, noise)))
    return fit_performance_model(rows, "hw-faults", seed=seed)


def test_a_503_during_registration_promotes_nothing(tracking, monkeypatch):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from orchestrator import registry

    monkeypatch.setattr(registry, "RETRY_WAITS_S", (0.01, 0.01))
    good, good_test = _bundle(0, 0.01)
    with mlflow.start_run():
        first = registry.register_bundle(good, good_test, {})
    assert first.promoted
    worse, worse_test = _bundle(1, 0.6)

    real = MlflowClient.get_model_version_by_alias
    outage = {"left": 10**6}

    def flaky(self, name, alias):
        if outage["left"] > 0:
            outage["left"] -= 1
            raise MlflowException("503 Service Unavailable", error_code="TEMPORARILY_UNAVAILABLE")
        return real(self, name, alias)

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", flaky)
    with mlflow.start_run(), pytest.raises(registry.RegistryUnavailable, match="failed 3 times"):
        registry.register_bundle(worse, worse_test, {})
    outage["left"] = 0
    assert registry.get_alias("hw-faults").version == first.version, "the champion is untouched"
    versions = MlflowClient().search_model_versions(f"name = '{registry.model_name('hw-faults')}'")
    assert all(not v.aliases for v in versions if v.version != first.version), "the unchecked version got no alias"
    # one transient failure is retried, and the comparison then runs for real
    outage["left"] = 1
    with mlflow.start_run():
        third = registry.register_bundle(worse, worse_test, {})
    assert f"champion v{first.version}'s" in third.reason and "first model" not in third.reason


def test_a_torn_measurement_store_still_refits(tmp_path, monkeypatch):
    from synthetic_rows import gemm_rows

    from orchestrator.cli import calibrate
    from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint

    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "cal"
    store = MeasurementStore(directory)
    rows = gemm_rows(np.random.default_rng(0), 40)
    store.add(rows)
    (directory / "fingerprint.json").write_text(json.dumps(HardwareFingerprint([local_node_fingerprint()]).to_dict()))
    with (directory / "measurements.jsonl").open("a") as f:
        f.write('{"op": "gemm", "params": "{\\"M\\": 3')  # the crash cut this line
    with pytest.warns(UserWarning, match="not whole JSON"):
        assert len(MeasurementStore(directory).rows()) == len(rows)
    with pytest.warns(UserWarning, match="not whole JSON"):
        code = calibrate.refit_main(directory, f"sqlite:///{tmp_path}/mlflow.db", 0, True)
    assert code == 0


def _cli(args, cwd, env=None):
    full = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", **(env or {})}
    full.pop("RAY_ADDRESS", None)
    full.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-m", *args], cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_two_autotunes_and_a_nightly_started_together_calibrate_once(tmp_path, tiny_job_dict):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_job_dict))
    procs = [
        _cli(
            ["orchestrator.autotune", "--job", "tiny.yaml", "--calibration-budget-s", "20", "--dry-run", "--json"],
            tmp_path,
        )
        for _ in range(2)
    ]
    procs.append(_cli(["orchestrator.cli.nightly", "--budget-s", "20", "--json"], tmp_path))
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    tunes = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs[:2]]
    nightly = json.loads(outs[2][0].strip().splitlines()[-1])
    calibrated = [t for t in tunes if t.get("calibration")] + [c for c in nightly["checked"] if c["recalibrated"]]
    assert len(calibrated) == 1, "exactly one process calibrated"
    assert tunes[0]["model"] == tunes[1]["model"]
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/.autotune/mlflow.db")
    name = tunes[0]["model"].split("/")[0]
    assert len(MlflowClient().search_model_versions(f"name = '{name}'")) == 1


def test_a_stale_ray_current_cluster_file_does_not_hang_a_command(tmp_path):
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    before = path.read_text() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("127.0.0.1:9")  # a crashed cluster's GCS address: nothing listens there
    try:
        code = (
            "from orchestrator import ray_runtime; ray_runtime.connect(num_cpus=1); import ray; "
            "print(int(ray.cluster_resources()['CPU'])); ray_runtime.shutdown()"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("RAY_ADDRESS", None)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == "1"
        assert time.monotonic() - t0 < 120
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)

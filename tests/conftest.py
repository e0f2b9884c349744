"""Shared fixtures: one local Ray cluster per session (starting Ray is the slow part)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_JOB = REPO / "examples" / "dlrm_small.yaml"

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TQDM_DISABLE", "1")
# The clusters tests start (local, simulated multi-node, and those the CLIs start) run their
# workers at the niceness the product's own clusters do (orchestrator/ray_runtime.py). A machine
# without Ray (the lent GPU machine) still runs the tests that need none (`pytest -m cuda`).
try:
    from orchestrator.ray_runtime import set_worker_niceness
except ModuleNotFoundError as missing:
    if missing.name != "ray":
        raise
else:
    set_worker_niceness()


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process with pytest's own exit status once every result is reported, before the
    collection of leftover objects and the interpreter's teardown. The session starts and stops
    Ray and gloo groups in this one process many times, and the objects and native threads
    they leave behind can fault as the last references go (Ray's core worker after a shutdown,
    ray-project/ray#31145; gloo's threads, as in `spawned.exit_worker`): CI on 12-01 printed
    "708 passed" and then make saw a segmentation fault. What this skips has already run or
    has nothing left to do: the session fixture shut Ray down, every server fixture stopped its
    process, the summary and the cache are written at session finish. A run that ends before
    its session finishes (a usage error) exits the usual way."""
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    os._exit(status)


@pytest.fixture()
def ray_local():
    """This process connected to a local 2-CPU Ray cluster, started once and kept for the tests
    after (a test that joins a simulated multi-node cluster shuts it down; the next use starts
    it again)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray


@pytest.fixture(scope="session", autouse=True)
def _ray_shutdown_at_exit():
    yield
    ray = sys.modules.get("ray")  # only a test that imported Ray can have started it
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture()
def one_rank():
    """This process as the one rank of a gloo process group, for probes that run real steps."""
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.fixture()
def tiny_job_dict() -> dict:
    return {
        "name": "tiny",
        "workload": "dlrm",
        "world_size": 2,
        "batch_size": 32,
        "iterations": 5,
        "warmup_iterations": 2,
        "dense": {"num_dense_features": 4, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "tables": [
            {
                "name": f"t{i}",
                "num_embeddings": 1000 * (i + 1),
                "embedding_dim": 8 * (1 + i % 2),
                "pooling_factor": 1 + i,
                "distribution": "uniform" if i % 2 else {"zipf": 1.1},
            }
            for i in range(5)
        ],
    }


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    """A scratch sqlite MLflow store with our experiment, as the working directory."""
    import mlflow

    from orchestrator import registry

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    registry.configure(uri)
    yield uri
    mlflow.set_tracking_uri(None)

"""The allocator setting reaches the processes that measure and train (its effect on pair timings
is measured by benchmarks/allocator_effect.py)."""

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.ray_runtime import WORKER_NICENESS
from probes.host_allocator import GLIBC_TUNABLES, allocator_env, apply_to_child_processes


def test_a_user_setting_is_kept():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert not apply_to_child_processes(env)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert allocator_env() == {"GLIBC_TUNABLES": GLIBC_TUNABLES}
    mine: dict = {}
    assert apply_to_child_processes(mine) and mine == allocator_env()


def test_a_local_ray_cluster_started_by_connect_gives_its_workers_the_setting_and_niceness_0():
    code = (
        "import os, ray\n"
        "from orchestrator import ray_runtime\n"
        "ray_runtime.connect(num_cpus=1)\n"
        "seen = ray.get(ray.remote(lambda: (os.environ.get('GLIBC_TUNABLES'), os.nice(0))).remote())\n"
        "print('SEEN', seen[0], 'NICE', seen[1])\n"
        "ray_runtime.shutdown()\n"
    )
    unset = ("GLIBC_TUNABLES", "RAY_ADDRESS", "RAY_worker_niceness")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    # Ray's own default is 15: its workers would yield the CPU to every other process on the node.
    assert f"SEEN {GLIBC_TUNABLES} NICE {WORKER_NICENESS}" in out.stdout, out.stderr[-2000:]


def test_the_image_sets_the_same_values():
    dockerfile = (Path(__file__).resolve().parents[1] / "deploy" / "Dockerfile").read_text()
    assert f"ENV GLIBC_TUNABLES={GLIBC_TUNABLES}" in dockerfile
    assert f"ENV RAY_worker_niceness={WORKER_NICENESS}" in dockerfile

"""The allocator setting reaches the processes that measure and train (its effect on pair timings
is measured by benchmarks/allocator_effect.py)."""

import os
import subprocess
import sys
from pathlib import Path

from probes.host_allocator import GLIBC_TUNABLES, allocator_env, apply_to_child_processes


def test_a_user_setting_is_kept():
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert not apply_to_child_processes(env)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert allocator_env() == {"GLIBC_TUNABLES": GLIBC_TUNABLES}
    mine: dict = {}
    assert apply_to_child_processes(mine) and mine == allocator_env()


def test_a_local_ray_cluster_started_by_connect_gives_its_workers_the_setting():
    code = (
        "import os, ray\n"
        "from orchestrator import ray_runtime\n"
        "ray_runtime.connect(num_cpus=1)\n"
        "print('SEEN', ray.get(ray.remote(lambda: os.environ.get('GLIBC_TUNABLES')).remote()))\n"
        "ray_runtime.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert f"SEEN {GLIBC_TUNABLES}" in out.stdout, out.stderr[-2000:]


def test_the_image_sets_the_same_value():
    dockerfile = (Path(__file__).resolve().parents[1] / "deploy" / "Dockerfile").read_text()
    assert f"ENV GLIBC_TUNABLES={GLIBC_TUNABLES}" in dockerfile

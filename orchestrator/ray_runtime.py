"""Connecting to Ray: an address, RAY_ADDRESS (set by `ray job submit`), or a new local cluster
of our own (never one a stale current-cluster file points at)."""

from __future__ import annotations

import logging
import os

import ray

from probes.host_allocator import apply_to_child_processes


# Probe actors and launched training workers both run at Ray's default worker niceness, so
# what calibration measures and what a job measures are alike. Resetting it through a
# job-level runtime_env (RAY_worker_niceness=0) was tried: every worker start then goes
# through runtime-env setup and idle workers are prestarted beside the job, which on the
# 2-core VM slowed the measured steps markedly (that run was stopped and not kept).
def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = {"ignore_reinit_error": True, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        # a local cluster's raylet and workers inherit the driver's environment; a deployed
        # cluster's nodes carry the same setting in their image (deploy/Dockerfile)
        apply_to_child_processes()
        # "local" always starts a cluster of our own: with no address, ray.init joins whatever
        # Ray's current-cluster file names, and after a crashed local cluster that is a dead GCS
        # it waits on for minutes.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()

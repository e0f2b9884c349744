"""Connecting to Ray: an address, RAY_ADDRESS (set by `ray job submit`), or a new local cluster
of our own (never one a stale current-cluster file points at)."""

from __future__ import annotations

import logging
import os
from typing import MutableMapping

import ray

from orchestrator.progress import quieten_libraries, verbose
from probes.host_allocator import apply_to_child_processes

# Ray starts its workers at niceness 15 (RAY_worker_niceness), below every ordinary process.
# Probe actors and training workers are the work itself, not background help: at 15, any
# other process on a node (an IDE, a compile, a neighbour's job) takes nearly all the CPU they
# need. On the 2-core VM with two busy loops beside it, starting two probe actors took 32 s
# instead of 1.9 s and one batch of twelve collective points 47.8 s instead of 4.9 s, so a
# calibration's phases ran past their deadlines and its actors were killed. So the workers of
# a cluster we start run at 0, like the processes a user starts; probes and launched jobs are
# both Ray workers, so what calibration measures and what a job meets stay alike. A value the
# user set is kept; a deployed cluster's image sets the same (deploy/Dockerfile). (Setting it
# per job through a runtime_env was tried once: every worker start then went through
# runtime-env setup, which slowed the measured steps.)
WORKER_NICENESS = "0"


def set_worker_niceness(environ: MutableMapping[str, str] | None = None) -> None:
    """Put WORKER_NICENESS into the environment a Ray cluster started from here inherits (a
    local cluster, or a simulated multi-node `ray.cluster_utils.Cluster`), unless the user set
    one."""
    (os.environ if environ is None else environ).setdefault("RAY_worker_niceness", WORKER_NICENESS)


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    if ray.is_initialized():
        return
    quieten_libraries()  # `import ray` set up its own loggers; before ray.init's own lines
    address = address or os.environ.get("RAY_ADDRESS")
    # The workers' own output (FBGEMM's loading lines, the profiler's notes, Ray Train's
    # controller) reaches the terminal only with --verbose; their errors still raise here.
    quiet = not verbose()
    kwargs = {
        "ignore_reinit_error": True,
        "logging_level": logging.ERROR if quiet else logging.INFO,
        "log_to_driver": not quiet,
    }
    if address:
        ray.init(address=address, **kwargs)
    else:
        # a local cluster's raylet and workers inherit the driver's environment; a deployed
        # cluster's nodes carry the same setting in their image (deploy/Dockerfile)
        apply_to_child_processes()
        set_worker_niceness()  # read by the raylet started here
        # "local" always starts a cluster of our own: with no address, ray.init joins whatever
        # Ray's current-cluster file names, and after a crashed local cluster that is a dead GCS
        # it waits on for minutes.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
    quieten_libraries()  # ray.init set up its own loggers


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()

"""Connecting to Ray: an address, RAY_ADDRESS (set by `ray job submit`), or a local cluster."""
from __future__ import annotations

import logging
import os

import ray

# Ray starts worker processes at niceness 15 so its own daemons stay responsive; a probe or a
# measured training worker at 15 is preempted by every daemon wake-up and by the driver, which
# on a small host moves a short step's time by tens of percent. What we time runs at 0, as the
# user's job will (Ray's job supervisor does the same for its own actor).
MEASUREMENT_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = {"ignore_reinit_error": True, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=MEASUREMENT_RUNTIME_ENV, **kwargs)


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()

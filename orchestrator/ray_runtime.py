"""Connecting to Ray: an address, RAY_ADDRESS (set by `ray job submit`), or a local cluster."""
from __future__ import annotations

import logging
import os

import ray


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = {"ignore_reinit_error": True, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()

"""What the commands share once their arguments parsed: the cluster's fingerprint and the
champion model (these import Ray and MLflow, so a command imports this module after parsing;
the parser's parts are in `orchestrator.cli.options`)."""

from __future__ import annotations

import os

from orchestrator import registry
from orchestrator.cli.options import NoModelError
from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint
from orchestrator.progress import say


def fingerprint(ray_address: str | None, start_ray: bool) -> HardwareFingerprint:
    """The whole Ray cluster's fingerprint when Ray is (or must be) in use, else this node's.

    A single local node fingerprints the same either way, so planning and predicting need not
    start Ray just to learn which models to load.
    """
    if start_ray or ray_address or os.environ.get("RAY_ADDRESS"):
        from orchestrator import ray_runtime
        from orchestrator.cluster import cluster_fingerprint

        ray_runtime.connect(ray_address)
        return cluster_fingerprint()
    return HardwareFingerprint([local_node_fingerprint()])


def champion_or_exit(hardware_id: str) -> registry.RegisteredBundle:
    found = registry.get_alias(hardware_id, registry.CHAMPION)
    if found is None:
        message = (
            f"no champion model for hardware {hardware_id}; run `python -m orchestrator.cli.calibrate` "
            f"or `python -m orchestrator.autotune --job J` first"
        )
        say(message)
        raise NoModelError(message)
    return found

"""Memory-copy probes: device-to-device, and host-to-device / device-to-host on a GPU.

Copies bound activation offload, embedding prefetch and the staging of collectives, so the
predictor costs them like any kernel. On a CPU-only machine only `d2d` exists (a host
memcpy between two tensors); host copies to and from a GPU use pinned host memory, as data
loaders and offload do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from probes.probe import LocalProbe, ProbeSpec, log_uniform, timed_measurement
from probes.timing import time_callable
from probes.vocabulary.ops import MEMCPY_OP, memcpy_directions, memcpy_params
from probes.vocabulary.records import Measurement


def measure_memcpy(
    direction: str, nbytes: int, device: torch.device | str = "cpu", max_seconds: float = 1.0
) -> Measurement:
    device = torch.device(device)
    if direction not in memcpy_directions(device.type):
        raise ValueError(
            f"memcpy direction {direction!r} needs a GPU; on {device.type} only {memcpy_directions(device.type)}"
        )
    numel = max(1, int(nbytes) // 4)
    pinned = device.type == "cuda"
    host = lambda: torch.randn(numel).pin_memory() if pinned else torch.randn(numel)  # noqa: E731
    if direction == "d2d":
        src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    elif direction == "h2d":
        src, dst = host(), torch.empty(numel, device=device)
    else:
        src, dst = torch.randn(numel, device=device), host()
    t = time_callable(lambda: dst.copy_(src, non_blocking=pinned), device=device, max_seconds=max_seconds)
    return timed_measurement(MEMCPY_OP, memcpy_params(direction, numel * 4), t, device, "memcpy")


def _measure(p: dict[str, Any], device: str) -> list[Measurement]:
    return [measure_memcpy(p["direction"], p["bytes"], device=device)]


PROBE = LocalProbe("memcpy", _measure)


def memcpy_specs(n: int, seed: int, device_kind: str = "cpu", max_bytes: int = 256 * 2**20) -> list[ProbeSpec]:
    """Copy sizes log-uniform from 4 B to `max_bytes`, directions in turn."""
    rng = np.random.default_rng(seed + 4)
    directions = memcpy_directions(device_kind)
    out = []
    for i in range(n):
        direction = directions[i % len(directions)]
        nbytes = log_uniform(rng, 4, max_bytes) // 4 * 4 or 4
        out.append(ProbeSpec("memcpy", {"direction": direction, "bytes": nbytes}, f"memcpy-{direction}:{nbytes}"))
    return out

"""Memory-copy probes: device-to-device, and host-to-device / device-to-host on a GPU.

Copies bound activation offload, embedding prefetch and the staging of collectives, so the
predictor costs them like any kernel. On a CPU-only machine only `d2d` exists (a host
memcpy between two tensors); host copies to and from a GPU use pinned host memory, as data
loaders and offload do.
"""
from __future__ import annotations

import torch

from probes.records import Measurement
from probes.timing import time_callable

DIRECTIONS = ("d2d", "h2d", "d2h")


def directions_for(device_kind: str) -> tuple[str, ...]:
    return DIRECTIONS if device_kind.startswith("cuda") else ("d2d",)


def memcpy_params(direction: str, nbytes: int) -> dict:
    return {"direction": direction, "bytes": float(nbytes)}


def measure_memcpy(direction: str, nbytes: int, device: torch.device | str = "cpu", max_seconds: float = 1.0) -> Measurement:
    device = torch.device(device)
    if direction not in directions_for(device.type):
        raise ValueError(f"memcpy direction {direction!r} needs a GPU; on {device.type} only {directions_for(device.type)}")
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
    return Measurement("memcpy", memcpy_params(direction, numel * 4), t.median_s, t.spread_s, t.repeats,
                       device=str(device), family="memcpy")

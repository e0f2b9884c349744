"""Bind each rank of a job (and each probe actor of a calibration) to its own share of its
host's cores, as `torchrun --numa-binding=exclusive` does for GPU jobs.

Why: unbound, the scheduler moves a rank's threads and its gloo / NCCL proxy threads between
cores, and a collective's helper thread can wake on the core where the other rank is computing.
Small steps pay for it (#26, 12-05, `benchmarks/core_binding.py`: a one-layer, hidden-64,
batch-2 data-parallel step on 2 ranks, six fresh launches each way, alternating: the launch
medians' median 3.36 ms bound against 5.87 ms unbound in a first, scratch run, and 4.14
against 6.88 in the committed one; a 34 ms step 1.00x and 0.96x). Binding does not remove slow
launches (the committed run had two bound launches of 6.5-7.7 ms). A calibration's steps and
the launched job's must run bound the same way, or the model prices a mode the job does not
run in: the probe actors and the launcher's ranks both bind here.

The share is of the cores this process may run on (`os.sched_getaffinity`, which a container's
cpuset narrows), split among the job's processes on the same host (`socket.gethostname`: the
nodes of a simulated Ray cluster share one host and its cores). `AUTOTUNE_CORE_BINDING=off`
leaves every process unbound: in a pod without Kubernetes' static CPU manager the allowed set
is the whole machine's, which pods beside it share too.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Sequence

BINDING_ENV = "AUTOTUNE_CORE_BINDING"
MODES = ("exclusive", "off")


class BindingError(ValueError):
    """An invalid `AUTOTUNE_CORE_BINDING`: names the variable and the values it takes."""


def binding_mode() -> str:
    """The binding asked for by `AUTOTUNE_CORE_BINDING` (default `exclusive`)."""
    mode = os.environ.get(BINDING_ENV, "exclusive").strip().lower()
    if mode not in MODES:
        raise BindingError(f"{BINDING_ENV}={mode!r} is not a binding; allowed: {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Slot:
    """A process's place among the job's processes on its host."""

    index: int
    count: int


def host_slots(hosts: Sequence[str]) -> list[Slot]:
    """Each process's slot on its host, from the host of every process in rank order."""
    seen: dict[str, int] = {}
    slots = []
    for host in hosts:
        slots.append(Slot(seen.get(host, 0), 0))
        seen[host] = seen.get(host, 0) + 1
    return [Slot(s.index, seen[h]) for s, h in zip(slots, hosts)]


def core_share(cores: Sequence[int], slot: Slot) -> list[int]:
    """Slot `slot.index` of `slot.count`'s disjoint, contiguous share of `cores` (sorted); with
    more processes than cores, the processes share the cores in turn (one core each)."""
    ordered = sorted(cores)
    if not ordered:
        raise ValueError("no cores to share")
    if slot.count <= 0 or not 0 <= slot.index < slot.count:
        raise ValueError(f"slot {slot.index} of {slot.count} is not a slot")
    if slot.count >= len(ordered):
        return [ordered[slot.index % len(ordered)]]
    size, extra = divmod(len(ordered), slot.count)  # the first `extra` slots take one core more
    start = slot.index * size + min(slot.index, extra)
    return ordered[start : start + size + (slot.index < extra)]


def bind_process(cores: Sequence[int]) -> int:
    """Bind every thread this process has (the collective backend's and Ray's included) to
    `cores`; threads started later inherit it from the thread that starts them. Returns how
    many threads were bound."""
    wanted = set(cores)
    bound = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), wanted)
            bound += 1
        except (ProcessLookupError, PermissionError):  # a thread that ended, or one not ours to move
            continue
    return bound


def bind_slot(slot: Slot, mode: str) -> list[int] | None:
    """Bind this process to its slot's share of the cores it may run on under `mode` (the
    driver's `binding_mode()`: a worker's environment may differ); the cores bound, or None
    where binding is off or the platform has none (macOS)."""
    if mode not in MODES:
        raise BindingError(f"{BINDING_ENV}={mode!r} is not a binding; allowed: {', '.join(MODES)}")
    if mode == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    share = core_share(sorted(os.sched_getaffinity(0)), slot)
    bind_process(share)
    return share


def host_name() -> str:
    return socket.gethostname()

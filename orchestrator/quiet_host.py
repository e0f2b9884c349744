"""Wait, before timing a real job, until the host's other processes have gone quiet.

A Ray Train run starts its control actors (controller, synchronisation, dataset manager,
placement-group cleaner) and Ray prestarts idle workers beside the training workers; each
imports Ray and torch, seconds of CPU each. On a small CPU host (2 cores here) the timed steps
of a job (well under a second of them) otherwise run inside that start-up storm: one `top`
snapshot during an end-to-end benchmark showed those actors at 20-80% of a core each while
the two training workers ran.
The workers themselves sleep while this waits, so the host's busy share is everyone else's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class QuietWait:
    waited_s: float
    busy_share: float  # the host's busy share (0..1) in the last sample
    quiet: bool  # False when the wait ran out first (the job is timed anyway; this says so)


def wait_for_quiet_host(busy_below: float = 0.25, sample_s: float = 0.5, max_wait_s: float = 20.0) -> QuietWait:
    """Sample the whole host's CPU busy share every `sample_s` until it is under `busy_below`
    (a share of all cores) or `max_wait_s` has passed."""
    import psutil

    t0 = time.monotonic()
    busy = psutil.cpu_percent(interval=sample_s) / 100.0
    while busy >= busy_below and time.monotonic() - t0 < max_wait_s:
        busy = psutil.cpu_percent(interval=sample_s) / 100.0
    return QuietWait(time.monotonic() - t0, busy, busy < busy_below)


@dataclass(frozen=True)
class CpuMark:
    """CPU seconds spent so far, host-wide (busy time summed over all cores) and by this process,
    at a wall-clock instant: two marks bound a timed span."""

    host_busy_s: float
    own_s: float
    wall_s: float


def cpu_mark() -> CpuMark:
    import psutil

    host = psutil.cpu_times()
    own = psutil.Process().cpu_times()
    # work done on the host's cores; guest time is inside user already, steal is the hypervisor's
    busy = host.user + host.system + sum(getattr(host, f, 0.0) for f in ("nice", "irq", "softirq"))
    return CpuMark(busy, own.user + own.system, time.monotonic())


def other_share(start: CpuMark, end: CpuMark, ranks_own_s: list[float], cores: int) -> float:
    """The share of the host's `cores` kept busy by processes other than the job's ranks on it
    (`ranks_own_s`: each such rank's CPU seconds over the span) between two marks.

    The quiet wait starts the timing once the host is quiet; this says whether it stayed so.
    On a 2-core host two gloo ranks each need a core: another process's tenth of a core there
    stretches both ranks' waits on each other, while a rank's own kernels time unchanged, so a
    step can run slower than its calibration's probes with no kernel check seeing it. Clamped
    at 0: /proc/stat counts in clock ticks and a quiet span's remainder can round below."""
    wall = end.wall_s - start.wall_s
    if wall <= 0 or cores <= 0:
        return 0.0
    other = (end.host_busy_s - start.host_busy_s) - sum(ranks_own_s)
    return max(0.0, other) / (wall * cores)

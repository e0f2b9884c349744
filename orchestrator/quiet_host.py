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

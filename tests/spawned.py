"""Helpers for ranks started with torch.multiprocessing in tests."""

import os
import sys


def exit_worker(queue=None) -> None:
    """End a spawned rank that finished cleanly without interpreter teardown, where gloo's
    background threads can abort the process ("terminate called without an active
    exception") after its results are written. A multiprocessing queue the rank reported
    through is flushed first (its feeder thread would otherwise be cut off)."""
    if queue is not None:
        queue.close()
        queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""Progress lines for long phases: done / failed / total, elapsed, ETA (tqdm on stderr)."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, desc: str, total: int, budget_s: float | None = None):
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.failed = 0
        interactive = sys.stderr.isatty()
        # In a log (CI, `ray job logs`) a line every 15 s reads better than a redraw every second.
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit="probe",
            file=sys.stderr,
            dynamic_ncols=interactive,
            mininterval=1.0 if interactive else 15.0,
            ascii=not interactive,
        )

    def update(self, done: int, failed: int) -> None:
        self.failed += failed
        postfix = {"failed": self.failed}
        if self.budget_s is not None:
            postfix["budget_left_s"] = max(0, int(self.budget_s - (time.monotonic() - self.start)))
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(done + failed)

    def close(self) -> None:
        self.bar.close()


def say(message: str) -> None:
    """A status line for the user (stderr, so --json output on stdout stays parseable)."""
    print(f"[autotune] {message}", file=sys.stderr, flush=True)

"""What the user reads on stderr: our status lines (the `autotune` logger), progress bars for
long phases (done / failed / total, elapsed, ETA), and nobody else's lines unless asked.

By default a command prints its own lines only: Ray's, its workers' (FBGEMM's library loading,
the profiler's USDT notes, Ray Train's controller), MLflow's and alembic's INFO lines and
library warnings are silenced, and come back with `--verbose`. `--quiet` keeps warnings and
errors. stdout stays for `--json`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

from tqdm import tqdm

LOG = logging.getLogger("autotune")

# The libraries whose INFO lines and warnings a default run hides (their errors still show).
THIRD_PARTY_LOGGERS = (
    "ray",
    "ray.train",
    "ray.tune",
    "ray.data",
    "mlflow",
    "alembic",
    "torch",
    "torchrec",
    "fbgemm_gpu",
    "urllib3",
    "filelock",
)

_state = {"quiet": False, "verbose": False}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a line is logged (a test's capture, a redirect
    made after the first line), not the stream of the moment the handler was made."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_output(quiet: bool = False, verbose: bool = False) -> None:
    """Set how much goes to stderr: ours at INFO (WARNING when `quiet`, DEBUG when `verbose`);
    third-party loggers at ERROR and Python warnings off unless `verbose`. Safe to call again
    (after `import ray`, which sets up its own logger, `quieten_libraries` re-applies it)."""
    _state.update(quiet=quiet, verbose=verbose)
    if not any(getattr(h, "_autotune", False) for h in LOG.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[autotune] %(message)s"))
        handler._autotune = True  # type: ignore[attr-defined]
        LOG.addHandler(handler)
    LOG.propagate = False
    LOG.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    quieten_libraries()


def quieten_libraries() -> None:
    """Third-party loggers to ERROR and warnings off, unless `--verbose`."""
    if _state["verbose"]:
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # read by MLflow per download
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    libraries = "|".join(n.replace(".", r"\.") for n in THIRD_PARTY_LOGGERS + ("pydantic", "google", "pkg_resources"))
    warnings.filterwarnings("ignore", module=rf"({libraries})(\.|$)")


def verbose() -> bool:
    """Whether the user asked for everything (`--verbose`): Ray then streams its workers' output."""
    return _state["verbose"]


class Progress:
    def __init__(self, desc: str, total: int, budget_s: float | None = None, unit: str = "probe"):
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.failed = 0
        interactive = sys.stderr.isatty()
        # In a log (CI, `ray job logs`) a line every 15 s reads better than a redraw every second.
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            file=sys.stderr,
            dynamic_ncols=interactive,
            mininterval=1.0 if interactive else 15.0,
            ascii=not interactive,
            # only when quiet: an explicit False would override TQDM_DISABLE
            **({"disable": True} if _state["quiet"] else {}),
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
    _logger().info(message)


def detail(message: str) -> None:
    """A line only `--verbose` shows (every op's figures, every candidate)."""
    _logger().debug(message)


def _logger() -> logging.Logger:
    """Our logger, set up on first use when no command did (a library call, a benchmark)."""
    if not LOG.handlers:
        configure_output(quiet=False, verbose=_state["verbose"])
    return LOG

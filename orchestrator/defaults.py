"""The defaults the commands show in their help and the library modules use, in a module that
imports nothing: `--help` builds every parser without loading torch, Ray or MLflow."""

from __future__ import annotations

DEFAULT_BUDGET_S = 120.0  # calibration probing time, seconds
DEFAULT_MODEL_AGE_DAYS = 7.0  # a champion older than this is recalibrated
DEFAULT_SENTINEL_BOUND = 0.35  # sentinel GMAE that marks a champion stale, at least ...
DEFAULT_SENTINEL_RATIO = 2.0  # ... or this many times the champion's own held-out GMAE on the same ops
# Sentinels running this many times slower (or faster) than the calibration timed them: drift.
# None: the speed is reported and logged, never acted on. On the 2-core development VM six
# passes within 40 minutes of a calibration read 1.05-1.16x while its kernel host checks read
# 0.94-0.99x, so no bound is set by default; a cluster whose sentinels hold steady sets one
# (a tenth shifts every prediction by a tenth).
DEFAULT_SENTINEL_SPEED_BOUND: float | None = None
DEFAULT_NIGHTLY_LOCK = "nightly"  # a name in the tracking server (orchestrator.lease), not a file
# The repetitive workloads `orchestrator.cli.fuse` can fuse: the keys of
# probes.workloads.fusion.models.WORKLOADS (a test keeps the two equal).
FUSION_WORKLOADS = ("cnn", "pointnet", "transformer")
FUSION_MEMORY_SHARE = 0.6  # of a device's memory a fused job may plan to hold, unless the job says otherwise

"""The defaults the commands show in their help and the library modules use, in a module that
imports nothing: `--help` builds every parser without loading torch, Ray or MLflow."""

from __future__ import annotations

DEFAULT_BUDGET_S = 120.0  # calibration probing time, seconds
DEFAULT_MODEL_AGE_DAYS = 7.0  # a champion older than this is recalibrated
DEFAULT_SENTINEL_BOUND = 0.35  # sentinel GMAE that marks a champion stale, at least ...
DEFAULT_SENTINEL_RATIO = 2.0  # ... or this many times the champion's own held-out GMAE on the same ops
# sentinels running this many times slower (or faster) than the calibration timed them: drift
# (a tenth shifts every prediction by a tenth, twice the +-5% a job's mean error is held to)
DEFAULT_SENTINEL_SPEED_BOUND = 1.10
DEFAULT_NIGHTLY_LOCK = "nightly"  # a name in the tracking server (orchestrator.lease), not a file
# The repetitive workloads `orchestrator.cli.fuse` can fuse: the keys of
# probes.workloads.fusion.models.WORKLOADS (a test keeps the two equal).
FUSION_WORKLOADS = ("cnn", "pointnet", "transformer")
FUSION_MEMORY_SHARE = 0.6  # of a device's memory a fused job may plan to hold, unless the job says otherwise

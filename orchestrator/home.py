"""Where the tool keeps what must outlive a run: `$AUTOTUNE_HOME` (default `.autotune` in the
working directory). Calibrations, sentinels, fusion sweeps, plans, Ray results, the nightly lock
and the default MLflow store all live under it.

Read at call time, never at import: `ray job submit --working-dir .` runs the command in Ray's
temporary copy of the directory, so a relative default would land in storage Ray deletes; the
deploy manifests set `AUTOTUNE_HOME` to the persistent volume, and a user submitting by hand
passes it in the job's runtime environment.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_VARIABLE = "AUTOTUNE_HOME"
DEFAULT_HOME = ".autotune"


def autotune_home() -> Path:
    """`$AUTOTUNE_HOME`, else `.autotune` (relative to the working directory)."""
    return Path(os.environ.get(HOME_VARIABLE) or DEFAULT_HOME)


def home_path(*parts: str) -> Path:
    """A path under `autotune_home()`."""
    return autotune_home().joinpath(*parts)


def default_tracking_uri() -> str:
    """The embedded MLflow store: a sqlite file under the home, beside the calibrations it indexes."""
    return f"sqlite:///{home_path('mlflow.db')}"

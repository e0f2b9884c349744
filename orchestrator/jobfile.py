"""Reading a job file: YAML → validated `JobSpec`, with errors that name file and field."""
from __future__ import annotations

from pathlib import Path

import yaml

from predictors.network import NetworkError, check_topology_size, topology_from_config
from probes.jobspec import JobSpec, JobSpecError


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    if not path.exists():
        raise JobSpecError([f"{path}: job file not found"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise JobSpecError([f"{path}: not valid YAML: {exc}"]) from None
    try:
        job = JobSpec.from_dict(data)
    except JobSpecError as exc:
        raise JobSpecError([f"{path}: {p}" for p in exc.problems]) from None
    # A named or explicit network is checked now; `calibrated` needs the cluster and its models.
    if job.network is not None and job.network.get("topology") != "calibrated":
        try:
            check_topology_size(topology_from_config(job.network), job.world_size)
        except NetworkError as exc:
            raise JobSpecError([f"{path}: {exc}"]) from None
    return job

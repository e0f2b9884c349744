"""Reading a job file: YAML → a validated `JobSpec` (DLRM), `TransformerJob` or `SweepJob`,
with errors that name file and field."""

from __future__ import annotations

from pathlib import Path

import yaml

from predictors.network import NetworkError, check_topology_size, topology_from_config
from probes.vocabulary.jobspec import MODEL_WORKLOADS, WORKLOADS, JobSpec, JobSpecError
from probes.vocabulary.jobspec_validation import parse_job
from probes.vocabulary.sweep_job import SweepJob
from probes.vocabulary.transformer_job import TransformerJob

ModelJob = JobSpec | TransformerJob  # one model on the cluster: what plan, run and predict take
Job = ModelJob | SweepJob

JOB_OPTION = "--job"


def load_job(path: str | Path, workloads: tuple[str, ...] = MODEL_WORKLOADS, command: str = "") -> ModelJob:
    """A job of one model (`workloads`: those the calling command handles; a job of another is
    refused naming `workload` and the allowed values)."""
    job = load_any_job(path, tuple(w for w in workloads if w in MODEL_WORKLOADS), command)
    assert not isinstance(job, SweepJob)  # refused above: "sweep" is not a model workload
    return job


def load_any_job(path: str | Path, workloads: tuple[str, ...] = WORKLOADS, command: str = "") -> Job:
    """Any job file, sweeps included (autotune's)."""
    path = Path(path)
    # Problems with the file itself name the option it came from (`--job`).
    if not path.exists():
        raise JobSpecError([f"{path}: job file not found"], fields=[JOB_OPTION])
    if not path.is_file():
        raise JobSpecError(
            [f"{path}: expected a job file (YAML), got a directory or other non-file"], fields=[JOB_OPTION]
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobSpecError(
            [f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); expected a YAML job file in UTF-8"],
            fields=[JOB_OPTION],
        ) from None
    except OSError as exc:
        raise JobSpecError([f"{path}: cannot read the job file: {exc.strerror or exc}"], fields=[JOB_OPTION]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobSpecError([f"{path}: not valid YAML: {exc}"], fields=[JOB_OPTION]) from None
    except RecursionError:
        raise JobSpecError([f"{path}: not valid YAML: nested too deeply"], fields=[JOB_OPTION]) from None
    try:
        job = parse_job(data)
    except JobSpecError as exc:
        raise JobSpecError([f"{path}: {p}" for p in exc.problems], fields=exc.fields) from None
    if job.workload not in workloads:
        raise JobSpecError(
            [
                f"{path}: workload: {job.workload!r} jobs are not handled by {command or 'this command'}; allowed: "
                f"{list(workloads)} (autotune takes every workload: {list(WORKLOADS)})"
            ],
            fields=["workload"],
        )
    # A named or explicit network is checked now; `calibrated` needs the cluster and its models.
    if isinstance(job, SweepJob):
        return job
    if job.network is not None and job.network.get("topology") != "calibrated":
        try:
            check_topology_size(topology_from_config(job.network), job.world_size)
        except NetworkError as exc:
            field = str(exc).split(":", 1)[0] if str(exc).startswith("network") else "network"
            raise JobSpecError([f"{path}: {exc}"], fields=[field]) from None
    return job

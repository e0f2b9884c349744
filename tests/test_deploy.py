"""deploy/: every manifest parses, has the fields its kind needs, and runs our CLIs as they are."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.autotune import parse_args as autotune_args
from orchestrator.nightly import build_parser as nightly_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
IMAGE = "ghcr.io/OWNER/cluster-autotune:0.1.0"


def docs(path: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d]


def by_kind(path: str) -> dict[str, dict]:
    return {d["kind"]: d for d in docs(path)}


def cli_args(command: str, module: str) -> list[str]:
    words = shlex.split(command)
    start = words.index("-m")
    assert words[start + 1] == module, command
    return words[start + 2:]


def containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def test_raycluster_has_a_head_and_a_gpu_pool_on_our_image():
    cluster = by_kind("kuberay/raycluster.yaml")["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    import ray

    assert spec["rayVersion"] == ray.__version__  # the image's Ray is the one we test with
    head = containers(spec["headGroupSpec"]["template"])[0]
    assert head["image"] == IMAGE
    assert {p["containerPort"] for p in head["ports"]} >= {6379, 8265}
    (group,) = spec["workerGroupSpecs"]
    worker = containers(group["template"])[0]
    assert worker["image"] == IMAGE
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == group["rayStartParams"]["num-gpus"]
    assert group["replicas"] >= 1
    # The pods read the MLflow client secret the MLflow manifests tell you to create.
    assert {"secretRef": {"name": "mlflow-client"}} in head["envFrom"]
    assert "mlflow-client" in (DEPLOY / "mlflow/kubernetes.yaml").read_text()


def test_rayjob_runs_autotune_with_valid_arguments_on_the_cluster():
    job = by_kind("kuberay/rayjob-autotune.yaml")["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    cluster = by_kind("kuberay/raycluster.yaml")["RayCluster"]["metadata"]["name"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster}
    args = autotune_args(cli_args(job["spec"]["entrypoint"], "orchestrator.autotune"))
    job_file = args.job.replace("/opt/cluster-autotune/", "")
    assert (DEPLOY.parent / job_file).exists()  # the image copies examples/ there
    assert containers(job["spec"]["submitterPodTemplate"])[0]["image"] == IMAGE


@pytest.mark.parametrize("path", ["kuberay/nightly-cronjob.yaml", "kuberay/nightly-raycronjob.yaml"])
def test_nightly_schedules_run_the_nightly_cli_with_valid_arguments(path):
    (doc,) = docs(path)
    assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", doc["spec"]["schedule"])
    if doc["kind"] == "CronJob":
        assert doc["apiVersion"] == "batch/v1" and doc["spec"]["concurrencyPolicy"] == "Forbid"
        (container,) = containers(doc["spec"]["jobTemplate"]["spec"]["template"])
        assert container["image"] == IMAGE
        command = shlex.join(container["command"])
        assert command.startswith("ray job submit --address http://autotune-head-svc:8265 -- ")
    else:
        assert doc["kind"] == "RayCronJob" and doc["apiVersion"] == "ray.io/v1"
        command = doc["spec"]["jobTemplate"]["entrypoint"]
    args = nightly_parser().parse_args(cli_args(command, "orchestrator.nightly"))
    assert args.budget_s > 0 and args.lock.startswith("/home/ray/work/.autotune/")


def test_mlflow_server_uses_postgres_and_basic_auth_with_secrets_from_the_environment():
    compose = yaml.safe_load((DEPLOY / "mlflow/docker-compose.yaml").read_text())
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for key in ("POSTGRES_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        assert services["mlflow"]["environment"][key].startswith("${"), "secrets come from .env, not the file"
    start = (DEPLOY / "mlflow/start-mlflow.sh").read_text()
    assert "--app-name basic-auth" in start and '--backend-store-uri "${DB}/' in start
    assert "postgresql://" in start and "--artifacts-destination" in start
    dockerfile = (DEPLOY / "mlflow/Dockerfile").read_text()
    import mlflow

    assert f"mlflow:v{mlflow.__version__}" in dockerfile and "psycopg[binary]" in dockerfile and "mlflow[auth]" in dockerfile
    k8s = {(d["kind"], d["metadata"]["name"]): d for d in docs("mlflow/kubernetes.yaml")}
    server = containers(k8s[("Deployment", "mlflow")]["spec"]["template"])[0]
    assert {"secretRef": {"name": "mlflow-server"}} in server["envFrom"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"
    assert k8s[("Service", "mlflow")]["spec"]["ports"][0]["port"] == 5000
    assert ("StatefulSet", "mlflow-postgres") in k8s


def test_image_installs_what_make_setup_pins():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    makefile = (DEPLOY.parent / "Makefile").read_text()
    for pin in ("torch==2.13.0", "torchrec==1.8.0"):
        assert pin in dockerfile and pin in makefile
    assert "fbgemm-gpu==1.8.0" in dockerfile  # the CUDA build on GPU nodes
    import ray

    assert f"rayproject/ray:{ray.__version__}-" in dockerfile
    for package in ("orchestrator", "probes", "predictors", "policies", "examples"):
        assert f"COPY --chown=ray:users {package} {package}" in dockerfile

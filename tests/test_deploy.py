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


# Multi-node clusters: a head that offers no work slots, worker groups whose Ray resources match
# their Kubernetes limits, NCCL / gloo network settings from one ConfigMap, /dev/shm in memory.

NCCL_CONFIGMAP = "cluster-autotune-nccl"


def kuberay_docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in sorted((DEPLOY / "kuberay").glob("*.yaml")) for d in docs(f"kuberay/{p.name}")]


def cluster_specs() -> list[tuple[str, dict]]:
    """Every RayCluster spec in deploy/kuberay, also those embedded in a RayJob / RayCronJob
    (`rayClusterSpec`, at any depth)."""
    found = []

    def walk(where: str, node) -> None:
        if isinstance(node, dict):
            if "headGroupSpec" in node or "workerGroupSpecs" in node:
                found.append((where, node))
            for value in node.values():
                walk(where, value)
        elif isinstance(node, list):
            for value in node:
                walk(where, value)

    for name, doc in kuberay_docs():
        walk(f"{name}:{doc['kind']}", doc)
    return found


def ray_container(pod_template: dict) -> dict:
    return containers(pod_template)[0]  # KubeRay runs Ray in the first container


def cpus(quantity) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_every_cluster_spec_is_found():
    wheres = [where for where, _ in cluster_specs()]
    assert "raycluster.yaml:RayCluster" in wheres
    for where, spec in cluster_specs():
        assert "headGroupSpec" in spec and spec.get("workerGroupSpecs"), where


def test_the_head_offers_no_cpu_or_gpu_slots():
    for where, spec in cluster_specs():
        head = spec["headGroupSpec"]
        params = head["rayStartParams"]
        assert params.get("num-cpus") == "0", f"{where}: the head must advertise no CPUs to Ray"
        assert params.get("num-gpus") == "0", f"{where}: the head must advertise no GPUs to Ray"
        for c in containers(head["template"]):
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                gpus = resources.get(kind, {}).get("nvidia.com/gpu", 0)
                assert int(gpus) == 0, f"{where}: head container {c['name']} {kind} nvidia.com/gpu={gpus}"


def test_worker_groups_declare_the_slots_their_limits_reserve():
    groups = [(where, g) for where, spec in cluster_specs() for g in spec["workerGroupSpecs"]]
    assert groups
    for where, group in groups:
        params = group["rayStartParams"]
        resources = ray_container(group["template"])["resources"]
        limits, requests = resources["limits"], resources.get("requests", {})
        label = f"{where} group {group['groupName']}"
        gpus = int(limits.get("nvidia.com/gpu", 0))
        assert int(params.get("num-gpus", 0)) == gpus, f"{label}: num-gpus != nvidia.com/gpu limit"
        assert int(requests.get("nvidia.com/gpu", gpus)) == gpus, label
        assert "num-cpus" in params and cpus(params["num-cpus"]) == cpus(limits["cpu"]), f"{label}: num-cpus != cpu limit"
        assert cpus(requests.get("cpu", limits["cpu"])) == cpus(limits["cpu"]), f"{label}: cpu request != limit"
        assert all(isinstance(v, str) for v in params.values()), f"{label}: rayStartParams values must be strings"


def test_every_ray_container_loads_the_nccl_configmap():
    for where, spec in cluster_specs():
        templates = [("head", spec["headGroupSpec"]["template"])]
        templates += [(g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]
        for group, template in templates:
            refs = [e["configMapRef"] for e in ray_container(template).get("envFrom", []) if "configMapRef" in e]
            assert {"name": NCCL_CONFIGMAP, "optional": True} in refs, f"{where} {group}"
            # The MLflow client secret stays wired in next to it.
            assert {"secretRef": {"name": "mlflow-client"}} in ray_container(template)["envFrom"], f"{where} {group}"


def test_nccl_configmap_defines_the_network_settings():
    maps = [d for _, d in kuberay_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == NCCL_CONFIGMAP]
    assert len(maps) == 1
    data = maps[0]["data"]
    assert {"NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG"} <= set(data)
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap data values must be strings (quote them)"
    assert data["NCCL_SOCKET_IFNAME"] and data["NCCL_IB_DISABLE"] in ("0", "1")
    # gloo takes plain interface names: no NCCL-style prefix, "=" or "^" syntax.
    assert re.fullmatch(r"[A-Za-z0-9_.@-]+(,[A-Za-z0-9_.@-]+)*", data["GLOO_SOCKET_IFNAME"])
    readme = (DEPLOY / "README.md").read_text()
    for key in (*data, "NCCL_IB_HCA"):
        assert f"`{key}`" in readme, f"{key} is not documented in deploy/README.md"


def test_worker_pods_mount_a_memory_backed_dev_shm():
    for where, spec in cluster_specs():
        for group in spec["workerGroupSpecs"]:
            pod = group["template"]["spec"]
            (mount,) = [m for m in ray_container(group["template"]).get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            (volume,) = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
            assert volume["emptyDir"]["medium"] == "Memory", f"{where} {group['groupName']}"

"""deploy/: every manifest parses, has the fields its kind needs, and runs our CLIs as they are."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.autotune import parse_args as autotune_args
from orchestrator.cli.nightly import build_parser as nightly_parser

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
    return words[start + 2 :]


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
    args = nightly_parser().parse_args(cli_args(command, "orchestrator.cli.nightly"))
    assert args.budget_s > 0 and args.lock == "nightly"  # one lock name, in the tracking server, for both


def test_the_head_keeps_autotune_home_on_its_persistent_volume():
    """Job drivers run on the head in Ray's copy of the working directory: AUTOTUNE_HOME must
    point at the mounted volume, or calibrations and plans are lost with the copy."""
    cluster = by_kind("kuberay/raycluster.yaml")["RayCluster"]
    (head,) = containers(cluster["spec"]["headGroupSpec"]["template"])
    home = {e["name"]: e.get("value") for e in head.get("env", [])}["AUTOTUNE_HOME"]
    volume = next(v for v in head["volumeMounts"] if v["name"] == "autotune-state")
    assert home == volume["mountPath"]
    assert f"AUTOTUNE_HOME={home}" in (DEPLOY / "Dockerfile").read_text()


def test_mlflow_server_uses_postgres_and_basic_auth_with_secrets_from_the_environment():
    compose = yaml.safe_load((DEPLOY / "mlflow/docker-compose.yaml").read_text())
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for key in ("POSTGRES_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        assert services["mlflow"]["environment"][key].startswith("${"), "secrets come from .env, not the file"
    start = (DEPLOY / "mlflow/start-mlflow.sh").read_text()
    # The backend store URI goes in through the environment (MLFLOW_BACKEND_STORE_URI), not argv.
    assert "--app-name basic-auth" in start and "export MLFLOW_BACKEND_STORE_URI" in start
    assert "postgresql://" in start and "--artifacts-destination" in start
    dockerfile = (DEPLOY / "mlflow/Dockerfile").read_text()
    import mlflow

    assert (
        f"mlflow:v{mlflow.__version__}" in dockerfile
        and "psycopg[binary]" in dockerfile
        and "mlflow[auth]" in dockerfile
    )
    # `make setup` installs the client from constraints.txt: the image moves with that pin.
    pins = (DEPLOY.parent / "constraints.txt").read_text().splitlines()
    assert f"mlflow=={mlflow.__version__}" in pins, "constraints.txt pins the client the image serves"
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
        assert "num-cpus" in params and cpus(params["num-cpus"]) == cpus(limits["cpu"]), (
            f"{label}: num-cpus != cpu limit"
        )
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
            (mount,) = [
                m for m in ray_container(group["template"]).get("volumeMounts", []) if m["mountPath"] == "/dev/shm"
            ]
            (volume,) = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
            assert volume["emptyDir"]["medium"] == "Memory", f"{where} {group['groupName']}"


# Security: Ray token auth on every cluster and in every submitter, nothing reachable from outside
# the cluster, NetworkPolicies around the head, MLflow and PostgreSQL, no secret on a command line
# or in a file, every pod non-root without capabilities, every container with requests and limits,
# MLflow on loopback in compose, non-root images. deploy/README.md, "Security", says why.

RAY_AUTH_SECRET = "autotune-ray-auth"
RAY_AUTH_KEY = "auth_token"  # the key KubeRay's authOptions.secretName requires
SUBMITTER_LABEL = ("ray-client-of", "autotune")
HEAD_CLIENT_PORTS = {8265, 6379, 10001}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|CREDENTIAL|PRIVATE_KEY", re.I)


def manifests() -> list[tuple[str, dict]]:
    """Every Kubernetes document under deploy/ (the compose file is not one)."""
    return kuberay_docs() + [("kubernetes.yaml", d) for d in docs("mlflow/kubernetes.yaml")]


def pod_templates() -> list[tuple[str, dict]]:
    """Every pod template (metadata + spec with containers), at any depth: Deployments,
    StatefulSets, CronJobs, Ray head / worker groups, RayJob / RayCronJob submitters."""
    found = []

    def walk(where: str, node) -> None:
        if isinstance(node, dict):
            spec = node.get("spec")
            if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
                found.append((where, node))
            for key, value in node.items():
                walk(f"{where}.{key}", value)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(f"{where}[{i}]", value)

    for name, doc in manifests():
        walk(f"{name}:{doc['kind']}/{doc['metadata']['name']}", doc)
    return found


def all_containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def named_cluster_specs() -> list[tuple[str, str | None, dict]]:
    """(where, cluster name if it is a RayCluster's own spec, spec) for every Ray cluster spec; an
    embedded one (a RayJob's rayClusterSpec) gets a generated name, so None."""
    found = []
    for where, spec in cluster_specs():
        name, kind = where.split(":")[0], where.split(":")[1]
        owners = [d for n, d in kuberay_docs() if n == name and d["kind"] == kind == "RayCluster" and d["spec"] == spec]
        found.append((where, owners[0]["metadata"]["name"] if owners else None, spec))
    return found


def is_ray_node(where: str) -> bool:
    """A pod template (as pod_templates() names it) of a Ray head or worker group."""
    return bool(re.search(r"\.(headGroupSpec|workerGroupSpecs\[\d+\])\.template$", where))


def ray_node_templates(spec: dict) -> list[tuple[str, dict]]:
    return [("head", spec["headGroupSpec"]["template"])] + [
        (g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]
    ]


def node_labels(name: str | None, template: dict, node_type: str) -> dict:
    """The labels KubeRay gives a Ray pod: the template's, plus ray.io/cluster and ray.io/node-type."""
    labels = dict(template.get("metadata", {}).get("labels", {}))
    labels["ray.io/node-type"] = node_type
    if name:
        labels["ray.io/cluster"] = name
    return labels


def network_policies() -> list[dict]:
    return [d for _, d in manifests() if d["kind"] == "NetworkPolicy"]


def selects(selector: dict, labels: dict) -> bool:
    """Whether a podSelector picks a pod with these labels (an empty one picks every pod: its
    rules count too, since a pod admits the union of what its policies allow)."""
    assert set(selector) <= {"matchLabels"}, f"only matchLabels selectors are checked: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def policies_for(labels: dict) -> list[dict]:
    return [p for p in network_policies() if selects(p["spec"]["podSelector"], labels)]


def env_by_name(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def token_env_ok(container: dict) -> bool:
    env = env_by_name(container)
    mode, token = env.get("RAY_AUTH_MODE", {}), env.get("RAY_AUTH_TOKEN", {})
    return mode.get("value") == "token" and token.get("valueFrom", {}).get("secretKeyRef") == {
        "name": RAY_AUTH_SECRET,
        "key": RAY_AUTH_KEY,
    }


def submitter_templates() -> list[tuple[str, dict]]:
    """Pods that talk to a Ray cluster's job API: RayJob / RayCronJob submitters and any pod that
    runs `ray job submit`."""
    found = []
    for where, template in pod_templates():
        argv = " ".join(w for c in template["spec"]["containers"] for w in c.get("command", []) + c.get("args", []))
        if where.endswith(".submitterPodTemplate") or "ray job submit" in argv:
            found.append((where, template))
    return found


def test_every_ray_cluster_requires_a_token_from_the_secret():
    specs = named_cluster_specs()
    assert specs
    for where, _, spec in specs:
        auth = spec.get("authOptions", {})
        assert auth.get("mode") == "token", f"{where}: authOptions.mode must be token"
        assert auth.get("secretName") == RAY_AUTH_SECRET, f"{where}: the token comes from the Secret {RAY_AUTH_SECRET}"
        assert tuple(int(x) for x in spec["rayVersion"].split(".")[:2]) >= (2, 52), (
            f"{where}: token auth needs Ray >= 2.52"
        )
        for group, template in ray_node_templates(spec):
            for c in all_containers(template):
                env = env_by_name(c)
                # KubeRay does not override an env var a container sets itself: one that turned auth
                # off, or took the token from elsewhere, would win.
                if "RAY_AUTH_MODE" in env:
                    assert env["RAY_AUTH_MODE"].get("value") == "token", f"{where} {group}: RAY_AUTH_MODE overridden"
                if "RAY_AUTH_TOKEN" in env:
                    assert token_env_ok(c), f"{where} {group}: RAY_AUTH_TOKEN must come from {RAY_AUTH_SECRET}"


def test_every_submitter_gets_the_token_and_the_label_the_head_admits():
    submitters = submitter_templates()
    wheres = " ".join(w for w, _ in submitters)
    for expected in ("nightly-cronjob.yaml", "rayjob-autotune.yaml", "nightly-raycronjob.yaml"):
        assert expected in wheres, f"{expected}: no submitter pod found"
    for where, template in submitters:
        (container,) = template["spec"]["containers"]
        assert token_env_ok(container), (
            f"{where}: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from {RAY_AUTH_SECRET}/{RAY_AUTH_KEY}"
        )
        labels = template.get("metadata", {}).get("labels", {})
        assert labels.get(SUBMITTER_LABEL[0]) == SUBMITTER_LABEL[1], (
            f"{where}: label {SUBMITTER_LABEL[0]}: {SUBMITTER_LABEL[1]}"
        )
    # Every RayJob / RayCronJob sets out its submitter (else KubeRay's default pod, without our label,
    # security context or limits, would be the one blocked by the NetworkPolicy).
    for name, doc in kuberay_docs():
        if doc["kind"] in ("RayJob", "RayCronJob"):
            job = doc["spec"]["jobTemplate"] if doc["kind"] == "RayCronJob" else doc["spec"]
            assert "submitterPodTemplate" in job, f"{name}: no submitterPodTemplate"


def test_nothing_is_exposed_outside_the_cluster():
    for name, doc in manifests():
        if doc["kind"] == "Service":
            assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", f"{name}: Service {doc['metadata']['name']}"
        if doc["kind"] == "Ingress":
            assert doc["spec"].get("tls"), f"{name}: an Ingress must terminate TLS"
    for where, _, spec in named_cluster_specs():
        assert spec["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP", f"{where}: head serviceType"
    for where, template in pod_templates():
        spec = template["spec"]
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), where
        for c in all_containers(template):
            assert not any("hostPort" in p for p in c.get("ports", [])), f"{where} {c['name']}: hostPort"


def test_the_ray_head_and_workers_are_fenced_by_network_policies():
    for where, name, spec in named_cluster_specs():
        # KubeRay binds the dashboard to 0.0.0.0 unless told otherwise: either way the head needs a policy.
        head_template = spec["headGroupSpec"]["template"]
        head = node_labels(name, head_template, "head")
        own = {"ray.io/cluster": name} if name else head_template.get("metadata", {}).get("labels", {})
        policies = policies_for(head)
        assert policies, f"{where}: no NetworkPolicy selects the head {head} (dashboard-host "
        f"{spec['headGroupSpec']['rayStartParams'].get('dashboard-host', '0.0.0.0 (KubeRay default)')})"
        submitters_admitted = False
        for policy in policies:
            assert "Ingress" in policy["spec"].get("policyTypes", []), policy["metadata"]["name"]
            for rule in policy["spec"].get("ingress", []):
                peers = rule.get("from")
                assert peers, f"{policy['metadata']['name']}: a rule without `from` admits every source"
                for peer in peers:
                    assert "ipBlock" not in peer, f"{policy['metadata']['name']}: no ipBlock peers"
                    assert peer.get("podSelector", {}).get("matchLabels"), (
                        f"{policy['metadata']['name']}: peers are pods picked by label"
                    )
                if all(p == {"podSelector": {"matchLabels": own}} for p in peers):
                    continue  # the cluster's own pods: every port (GCS, raylets, object transfers)
                ports = {p.get("port") for p in rule.get("ports", [])}
                assert ports and ports <= HEAD_CLIENT_PORTS, (
                    f"{policy['metadata']['name']}: other pods reach only {HEAD_CLIENT_PORTS}, got {ports or 'all'}"
                )
                if any(p["podSelector"]["matchLabels"] == dict([SUBMITTER_LABEL]) for p in peers) and 8265 in ports:
                    submitters_admitted = True
        assert submitters_admitted, f"{where}: the submitter pods are not admitted to the job API (8265)"
        for group in spec["workerGroupSpecs"]:
            labels = node_labels(name, group["template"], "worker")
            policies = policies_for(labels)
            assert policies, f"{where} {group['groupName']}: no NetworkPolicy selects the workers"
            for policy in policies:
                for rule in policy["spec"].get("ingress", []):
                    assert rule.get("from") == [{"podSelector": {"matchLabels": own}}], (
                        f"{policy['metadata']['name']}: workers admit only their cluster"
                    )


def test_mlflow_admits_only_the_ray_pods_and_postgres_only_mlflow():
    k8s = {(d["kind"], d["metadata"]["name"]): d for d in docs("mlflow/kubernetes.yaml")}
    cluster = by_kind("kuberay/raycluster.yaml")["RayCluster"]["metadata"]["name"]
    expected = {"mlflow": ({"ray.io/cluster": cluster}, 5000), "mlflow-postgres": ({"app": "mlflow"}, 5432)}
    for workload, (peer, port) in expected.items():
        kind = "Deployment" if workload == "mlflow" else "StatefulSet"
        labels = k8s[(kind, workload)]["spec"]["template"]["metadata"]["labels"]
        policies = policies_for(labels)
        assert policies, f"no NetworkPolicy selects {workload}"
        for policy in policies:
            assert "Ingress" in policy["spec"]["policyTypes"]
            for rule in policy["spec"]["ingress"]:
                assert rule["from"] == [{"podSelector": {"matchLabels": peer}}], f"{workload}: only {peer}"
                assert [p["port"] for p in rule["ports"]] == [port], f"{workload}: only port {port}"


def argv_texts() -> list[tuple[str, str]]:
    """Every command line a manifest defines: container command / args, exec probes, lifecycle
    hooks, RayJob / RayCronJob entrypoints (argv of the driver on the head)."""
    found = []
    for where, template in pod_templates():
        for c in all_containers(template):
            found.append((f"{where} {c['name']}", shlex.join(c.get("command", []) + c.get("args", []))))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if "exec" in c.get(probe, {}):
                    found.append((f"{where} {c['name']} {probe}", shlex.join(c[probe]["exec"]["command"])))
            for hook in c.get("lifecycle", {}).values():
                if "exec" in hook:
                    found.append((f"{where} {c['name']} lifecycle", shlex.join(hook["exec"]["command"])))
    for name, doc in kuberay_docs():
        job = doc.get("spec", {}).get("jobTemplate", doc.get("spec"))
        if isinstance(job, dict) and "entrypoint" in job:
            found.append((f"{name} entrypoint", job["entrypoint"]))
    return found


LEAKS = [
    re.compile(r"password", re.I),
    re.compile(r"[A-Z_]*(PASSWORD|TOKEN|SECRET)[A-Z_]*=", re.I),  # VAR=value on a command line
    re.compile(r"\w+://[^/\s:@]+:[^/\s@]+@"),  # scheme://user:password@host
    re.compile(r"\$\{?\w*(PASSWORD|TOKEN|SECRET|CREDENTIAL)\w*\}?", re.I),  # a shell expanding a secret into argv
]


def test_no_secret_reaches_a_command_line():
    texts = argv_texts()
    assert any("ray job submit" in t for _, t in texts)
    for where, text in texts:
        for leak in LEAKS:
            assert not leak.search(text), f"{where}: {leak.pattern} in {text!r}"
    for where, template in pod_templates():
        for c in all_containers(template):
            argv = " ".join(c.get("command", []) + c.get("args", []))
            secret_env = {
                n
                for n, e in env_by_name(c).items()
                if "secretKeyRef" in e.get("valueFrom", {}) or SECRET_NAME.search(n)
            }
            expanded = set(re.findall(r"\$\((\w+)\)", argv))  # Kubernetes' $(VAR) expansion into argv
            assert not expanded & secret_env, f"{where} {c['name']}: {expanded & secret_env} expanded into argv"
            if any("secretRef" in e for e in c.get("envFrom", [])):
                assert not expanded, (
                    f"{where} {c['name']}: $(VAR) in argv next to envFrom secretRef (which names are secret?)"
                )
            for name, e in env_by_name(c).items():
                if SECRET_NAME.search(name):
                    assert "value" not in e, f"{where} {c['name']}: {name} is a literal, not a secretKeyRef"


def test_mlflow_gets_the_database_password_through_libpq_not_a_uri_argv_or_file():
    start = (DEPLOY / "mlflow/start-mlflow.sh").read_text()
    code = "\n".join(line for line in start.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r'PGPASSWORD="\$\{POSTGRES_PASSWORD\}"', code) and re.search(r"export [^\n]*PGPASSWORD", code)
    # The password is checked, copied into PGPASSWORD and unset, nothing else; no URI carries it.
    allowed = (
        r': "\$\{POSTGRES_HOST:\?\}" .*"\$\{POSTGRES_PASSWORD:\?\}".*',
        r'PGPASSWORD="\$\{POSTGRES_PASSWORD\}"',
        r"unset POSTGRES_PASSWORD",
    )
    for line in (x.strip() for x in code.splitlines() if "POSTGRES_PASSWORD" in x):
        assert any(re.fullmatch(a, line) for a in allowed), f"start-mlflow.sh uses POSTGRES_PASSWORD in {line!r}"
    assert not re.search(r"postgresql://[^/\s\"']", code), "the store URI must leave host, user and password to libpq"
    exec_line = code[code.index("exec mlflow server") :]
    assert "--backend-store-uri" not in exec_line and "MLFLOW_BACKEND_STORE_URI" in code
    for leak in LEAKS + [re.compile(r"PGPASSWORD")]:
        assert not leak.search(exec_line), f"{leak.pattern} on mlflow server's command line"
    assert not re.search(r"(^|[^<>&])>\s*[^&\s]|\btee\b|/tmp", code), (
        "start-mlflow.sh writes no file (and nothing to /tmp)"
    )
    ini = (DEPLOY / "mlflow/basic_auth.ini").read_text()
    uri = re.search(r"^database_uri = (\S+)$", ini, re.M).group(1)
    assert uri.startswith("postgresql:///"), "the auth database URI names only the database"
    assert not re.search(r"password", re.sub(r"(?m)^#.*$", "", ini), re.I)
    assert "COPY basic_auth.ini" in (DEPLOY / "mlflow/Dockerfile").read_text()


def image_user(dockerfile: str) -> str:
    users = re.findall(r"^USER\s+(\S+)\s*$", (DEPLOY / dockerfile).read_text(), re.M)
    assert users, f"{dockerfile}: no USER"
    return users[-1]


def test_images_end_as_a_non_root_user_without_passwordless_sudo():
    for dockerfile in ("Dockerfile", "mlflow/Dockerfile"):
        user = image_user(dockerfile)
        assert user.split(":")[0] not in ("root", "0"), f"{dockerfile}: runs as {user}"
        assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), f"{dockerfile}: numeric USER, so runAsNonRoot can verify it"
        lines = [x for x in (DEPLOY / dockerfile).read_text().splitlines() if x.strip() and not x.startswith("#")]
        assert lines[-1].startswith("USER "), f"{dockerfile}: USER is the last instruction"
    ray = (DEPLOY / "Dockerfile").read_text()
    # rayproject/ray appends `ray ALL=NOPASSWD: ALL` to /etc/sudoers and adds ray to the sudo group.
    assert "sed -i '/NOPASSWD/d' /etc/sudoers" in ray and "rm -f /etc/sudoers.d/*" in ray
    assert "gpasswd -d ray sudo" in ray and "! grep -rqs NOPASSWD /etc/sudoers /etc/sudoers.d" in ray
    # The pods run as the images' users.
    uids = {
        "Dockerfile": int(image_user("Dockerfile").split(":")[0]),
        "mlflow/Dockerfile": int(image_user("mlflow/Dockerfile").split(":")[0]),
    }
    for where, template in pod_templates():
        image = template["spec"]["containers"][0]["image"]
        expected = (
            uids["Dockerfile"]
            if image == IMAGE
            else uids["mlflow/Dockerfile"]
            if "cluster-autotune-mlflow" in image
            else None
        )
        if expected is not None:
            assert template["spec"]["securityContext"]["runAsUser"] == expected, where


def test_every_pod_runs_non_root_without_privileges():
    templates = pod_templates()
    assert sum(is_ray_node(w) for w, _ in templates) == sum(1 + len(s["workerGroupSpecs"]) for _, s in cluster_specs())
    assert len(templates) >= 7
    for where, template in templates:
        spec = template["spec"]
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
        assert isinstance(pod.get("runAsUser"), int) and pod["runAsUser"] > 0, f"{where}: runAsUser"
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, f"{where}: seccompProfile"
        assert spec.get("automountServiceAccountToken") is False, f"{where}: no Kubernetes API token"
        for c in all_containers(template):
            sc, label = c.get("securityContext", {}), f"{where} {c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, f"{label}: allowPrivilegeEscalation"
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{label}: capabilities drop ALL"
            assert not sc.get("capabilities", {}).get("add"), f"{label}: no capabilities added"
            assert not sc.get("privileged"), f"{label}: privileged"
            assert sc.get("runAsNonRoot", True) is True and sc.get("runAsUser", 1) != 0, f"{label}: root"
            assert sc.get("seccompProfile", {"type": "RuntimeDefault"}) == {"type": "RuntimeDefault"}, label
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            if is_ray_node(where):
                # Ray writes /tmp/ray: a writable root filesystem, and /tmp on an emptyDir.
                assert "emptyDir" in volumes.get(mounts.get("/tmp"), {}), f"{label}: /tmp must be an emptyDir"
            else:
                assert sc.get("readOnlyRootFilesystem") is True, f"{label}: readOnlyRootFilesystem"


def test_every_container_has_requests_and_limits():
    for where, template in pod_templates():
        for c in all_containers(template):
            resources = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), f"{where} {c['name']}: {kind} cpu and memory"


def test_compose_publishes_mlflow_on_loopback_only_and_runs_unprivileged():
    services = yaml.safe_load((DEPLOY / "mlflow/docker-compose.yaml").read_text())["services"]
    ports = services["mlflow"]["ports"]
    assert ports
    for port in ports:
        if isinstance(port, dict):
            assert port.get("host_ip") == "127.0.0.1", port
        else:
            assert str(port).startswith("127.0.0.1:"), f"MLflow is plain HTTP: publish it on 127.0.0.1, not {port}"
    assert "ports" not in services["postgres"], "PostgreSQL publishes no port"
    for name, service in services.items():
        assert service.get("network_mode") != "host", name
        assert service.get("read_only") is True and "ALL" in service.get("cap_drop", []), name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert not service.get("privileged"), name
        limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
        assert {"cpus", "memory"} <= set(limits), f"{name}: resource limits"
        for key in ("healthcheck", "command", "entrypoint"):
            text = json_text(service.get(key, ""))
            assert not re.search(r"password", text, re.I), f"{name} {key}"
    assert str(services["postgres"]["user"]).split(":")[0] not in ("0", "root")


def json_text(value) -> str:
    return (
        value
        if isinstance(value, str)
        else " ".join(map(str, value.get("test", []) if isinstance(value, dict) else value))
    )


def test_readme_documents_the_security_settings():
    readme = (DEPLOY / "README.md").read_text()
    assert "## Security" in readme
    security = readme[readme.index("## Security") :]
    for needle in (
        f"kubectl create secret generic {RAY_AUTH_SECRET}",
        "RAY_AUTH_MODE=token",
        "RAY_AUTH_TOKEN",
        "authOptions",
        "NetworkPolicy",
        "ClusterIP",
        "127.0.0.1",
        "TLS",
        "runAsNonRoot",
        "allowPrivilegeEscalation",
        "readOnlyRootFilesystem",
        "PGPASSWORD",
        "CNI",
        "kubectl create secret generic mlflow-db",
    ):
        assert needle in security, f"deploy/README.md, Security: {needle}"

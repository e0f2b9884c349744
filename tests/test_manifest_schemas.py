"""deploy/'s Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate ships them),
strictly: a misspelt or misplaced field fails here instead of on a cluster. The pod templates
inside the KubeRay resources (the head, the worker groups, the submitters) are checked as the
pods they become; the KubeRay resources' own fields are checked against KubeRay's CRDs by
test_kuberay_crds.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFESTS = sorted((DEPLOY / "kuberay").glob("*.yaml")) + [DEPLOY / "mlflow" / "kubernetes.yaml"]
# The oldest Kubernetes deploy/README.md supports (KubeRay 1.6's floor); its schemas are the strictest.
KUBERNETES_VERSION = "1.30.0"


def _pod(template: dict[str, Any], where: str) -> dict[str, Any]:
    metadata = {"name": where.replace("/", "-").replace(":", "-").lower(), **template.get("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def _ray_pod_templates(doc: dict[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = doc["spec"]
    if doc["kind"] == "RayCronJob":
        spec = spec["jobTemplate"]
    cluster = spec.get("rayClusterSpec", spec) if doc["kind"] != "RayCluster" else spec
    if "headGroupSpec" in cluster:
        yield f"{where}:head", _pod(cluster["headGroupSpec"]["template"], f"{where}:head")
    for group in cluster.get("workerGroupSpecs", []):
        yield f"{where}:{group['groupName']}", _pod(group["template"], f"{where}:{group['groupName']}")
    if "submitterPodTemplate" in spec:
        yield f"{where}:submitter", _pod(spec["submitterPodTemplate"], f"{where}:submitter")


def resources() -> list[tuple[str, dict[str, Any]]]:
    """(where, resource) for every core resource, and every KubeRay pod template as a Pod."""
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            where = f"{path.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}"
            if doc["apiVersion"].startswith("ray.io/"):
                out.extend(_ray_pod_templates(doc, where))
            else:
                out.append((where, doc))
    return out


RESOURCES = resources()


def test_every_manifest_and_every_ray_pod_is_covered():
    kinds = {r["kind"] for _, r in RESOURCES}
    assert {"Pod", "CronJob", "ConfigMap", "PersistentVolumeClaim", "NetworkPolicy", "Deployment"} <= kinds
    pods = [w for w, r in RESOURCES if r["kind"] == "Pod"]
    assert any(w.endswith(":head") for w in pods) and any(w.endswith(":submitter") for w in pods)


@pytest.mark.parametrize("where, resource", RESOURCES, ids=[w for w, _ in RESOURCES])
def test_the_manifest_matches_the_kubernetes_schema(where, resource):
    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_field_is_caught():
    where, pod = next((w, r) for w, r in RESOURCES if w.endswith(":head"))
    wrong = copy.deepcopy(pod)
    container = wrong["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")  # the singular: a typo a cluster would reject
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)

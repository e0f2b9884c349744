"""deploy/kuberay's KubeRay resources (RayCluster, RayJob, RayCronJob) against the CRDs' own
OpenAPI schemas from the oldest KubeRay release deploy/README.md supports (kept under
tests/data), strictly: a field the CRD does not define fails here, as `kubectl apply
--validate=strict` would refuse it, instead of being pruned silently on a cluster. (The pods
inside them are also checked against Kubernetes' core schemas by test_manifest_schemas.py.)"""

from __future__ import annotations

import copy
import gzip
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "tests" / "data" / "kuberay_crds_v1.6.2"
CRD_FILES = {"RayCluster": "ray.io_rayclusters", "RayJob": "ray.io_rayjobs", "RayCronJob": "ray.io_raycronjobs"}
PRESERVE = "x-kubernetes-preserve-unknown-fields"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def strict(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (unless the
    CRD lets it keep unknown fields), as the API server's strict field validation reads it."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k != "properties" else {n: strict(s) for n, s in v.items()} for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(PRESERVE):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=None)
def validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    with gzip.open(CRDS / f"{CRD_FILES[kind]}.yaml.gz", "rt") as f:
        crd = yaml.load(f, Loader=_Loader)
    assert crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft4Validator(strict(served["schema"]["openAPIV3Schema"]))


def ray_resources() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((REPO / "deploy" / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("apiVersion", "").startswith("ray.io/"):
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def problems(doc: dict[str, Any]) -> list[str]:
    check = validator(doc["kind"], doc["apiVersion"].split("/", 1)[1])
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in check.iter_errors(doc))


def test_every_kuberay_kind_deploy_uses_is_checked():
    assert sorted({doc["kind"] for _, doc in ray_resources()}) == ["RayCluster", "RayCronJob", "RayJob"]


@pytest.mark.parametrize("where, doc", ray_resources(), ids=[w for w, _ in ray_resources()])
def test_each_kuberay_resource_matches_its_crd(where, doc):
    assert problems(doc) == [], where


def _first(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(doc for _, doc in ray_resources() if doc["kind"] == kind))


def test_a_misspelt_or_mistyped_field_fails():
    cluster = _first("RayCluster")
    cluster["spec"]["headGroupSpec"]["rayStartParam"] = {"num-cpus": "0"}  # rayStartParams
    assert any("rayStartParam" in p for p in problems(cluster))
    cluster = _first("RayCluster")
    cluster["spec"]["workerGroupSpecs"][0]["replica"] = 2  # replicas
    assert any("replica" in p for p in problems(cluster))
    cluster = _first("RayCluster")
    cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # a map of strings
    assert any("rayStartParams.num-cpus" in p for p in problems(cluster))
    job = _first("RayJob")
    job["spec"]["shutdownAfterJobFinish"] = True  # shutdownAfterJobFinishes
    assert any("shutdownAfterJobFinish" in p for p in problems(job))
    cron = _first("RayCronJob")
    cron["spec"]["schedules"] = cron["spec"].pop("schedule")
    assert problems(cron)

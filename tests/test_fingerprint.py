import re
import subprocess
import sys
from pathlib import Path

from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint


def test_fingerprint_without_gpu_is_not_an_error():
    node = local_node_fingerprint()
    assert node.devices, "a CPU-only node still has devices (its CPU slots)"
    assert all(d.kind == "cpu" for d in node.devices)  # this machine has no GPU
    assert node.cpu_cores == len(node.devices)
    assert {"torch", "fbgemm_gpu", "gloo"} <= set(node.software)
    fp = HardwareFingerprint([node])
    assert fp.device_kind == "cpu"
    assert re.fullmatch(r"cpu\d+c-n1-[0-9a-f]{10}", fp.hardware_id)


def test_fbgemm_version_is_the_packages_own_without_loading_its_kernels():
    """Every command fingerprints; reading fbgemm_gpu's version must not cost the import of its
    kernel libraries, and must say what `fbgemm_gpu.__version__` says (a model's freshness is
    checked against it)."""
    probe = (
        "import sys; from orchestrator.cluster import software_versions; v = software_versions()['fbgemm_gpu']; "
        "loaded = 'fbgemm_gpu' in sys.modules; import fbgemm_gpu; print(v, loaded, fbgemm_gpu.__version__)"
    )
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", probe], cwd=repo, capture_output=True, text=True, check=True)
    read, loaded, stated = out.stdout.split()
    assert loaded == "False" and read == stated


def test_fbgemm_version_falls_back_to_the_import_and_says_when_it_is_missing(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.util

    from orchestrator import cluster

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cluster.fbgemm_version() == "missing"
    package = tmp_path / "fbgemm_gpu"
    package.mkdir()
    (package / "__init__.py").write_text("__version__ = '0.0.test'\n")  # no docs/target.*.json.py
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fbgemm_gpu", raising=False)  # put back after the test
    spec = importlib.machinery.PathFinder.find_spec("fbgemm_gpu", [str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    try:
        assert cluster.fbgemm_version() == "0.0.test"
    finally:
        sys.modules.pop("fbgemm_gpu", None)  # the stand-in must not serve later imports


def test_hardware_id_is_stable_and_ignores_software_and_hostnames():
    a, b = local_node_fingerprint(), local_node_fingerprint()
    assert HardwareFingerprint([a]).hardware_id == HardwareFingerprint([b]).hardware_id
    b.hostname, b.software = "elsewhere", {**b.software, "torch": "9.9"}
    assert HardwareFingerprint([a]).hardware_id == HardwareFingerprint([b]).hardware_id
    assert HardwareFingerprint([a]).software != HardwareFingerprint([b]).software


def test_hardware_id_changes_with_hardware():
    a, b = local_node_fingerprint(), local_node_fingerprint()
    b.cpu_model = "Some Other CPU"
    assert HardwareFingerprint([a]).hardware_id != HardwareFingerprint([b]).hardware_id
    assert HardwareFingerprint([a]).hardware_id != HardwareFingerprint([a, a]).hardware_id


def test_mixed_software_is_reported():
    a, b = local_node_fingerprint(), local_node_fingerprint()
    b.software = {**b.software, "torch": "0.0"}
    assert HardwareFingerprint([a, b]).software["torch"].startswith("mixed:")


def test_cpu_slots_cap_the_devices_of_a_cpu_node():
    node = local_node_fingerprint(cpu_slots=1)
    if any(d.kind == "cuda" for d in node.devices):
        return  # GPU nodes count GPUs, not CPU slots
    assert len(node.devices) == 1 and node.cpu_cores >= 1


def node_with(cpu_slots=None, gpu_slots=None, memory_gib=None, node_id=""):
    node = local_node_fingerprint(cpu_slots=cpu_slots, gpu_slots=gpu_slots)
    if memory_gib is not None:
        node.memory_bytes = memory_gib * 2**30
    node.node_id = node_id
    return node


def test_a_head_offering_no_cpus_is_not_part_of_the_hardware():
    head = node_with(cpu_slots=0, memory_gib=1, node_id="head")
    workers = [node_with(cpu_slots=1, node_id="w1"), node_with(cpu_slots=1, node_id="w2")]
    assert head.devices == [], "a node started with --num-cpus=0 offers no device"
    fp = HardwareFingerprint([head, *workers])
    assert fp.devices_per_node == [1, 1]
    assert fp.hardware_id == HardwareFingerprint(workers).hardware_id
    assert fp.hardware_id.startswith("cpu1c-n2-")
    head.memory_bytes, head.cpu_cores = 3 * 2**30, 96  # the head's size never changes the id
    assert HardwareFingerprint([head, *workers]).hardware_id == fp.hardware_id
    assert fp.min_device_memory_bytes == min(d.memory_bytes for w in workers for d in w.devices)
    assert "(+1 node(s) without devices)" in fp.summary()
    assert fp.node_ids == ["w1", "w2"]


def test_with_gpus_a_cpu_head_is_no_device_even_if_it_offers_cpus():
    head = node_with(cpu_slots=4, gpu_slots=0, node_id="head")  # a KubeRay head: CPUs, no GPU
    workers = [node_with(cpu_slots=8, gpu_slots=2, node_id=f"w{i}") for i in range(2)]
    fp = HardwareFingerprint([head, *workers])
    assert fp.device_kind == "cuda"
    assert fp.devices_per_node == [2, 2] and fp.node_ids == ["w0", "w1"]
    assert fp.hardware_id == HardwareFingerprint(workers).hardware_id
    assert fp.hardware_id.split("-")[1] == "n2"
    # GPUs Ray declares but NVML cannot see: counted, memory unknown, and a plan must be given a cap
    if all(d.memory_bytes == 0 for w in workers for d in w.devices):
        import pytest

        from policies.planning import memory_cap_bytes
        from probes.vocabulary.jobspec import JobSpec, JobSpecError

        job = JobSpec.from_dict(
            {
                "workload": "dlrm",
                "world_size": 4,
                "batch_size": 8,
                "dense": {"num_dense_features": 2, "bottom_mlp": [4], "top_mlp": [1]},
                "tables": [{"name": "t", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1}],
            }
        )
        with pytest.raises(JobSpecError, match="memory_cap_gb: required here"):
            memory_cap_bytes(job, fp)


def test_two_node_types_are_described_per_type_biggest_first():
    small, big = node_with(cpu_slots=1, node_id="s"), node_with(cpu_slots=2, node_id="b")
    if len(big.devices) < 2:
        return  # a one-core machine cannot offer two CPU slots
    fp = HardwareFingerprint([small, big])
    assert fp.devices_per_node == [2, 1] and fp.node_ids == ["b", "s"]
    types = {t.label: (t.nodes, t.devices_per_node) for t in fp.node_types()}
    assert types == {"cpu2c": (1, 2), "cpu1c": (1, 1)}
    assert fp.hardware_id.startswith("mixed-n2-")
    assert "node types:" in fp.summary()


def test_a_stored_fingerprint_gives_the_same_hardware_id():
    fp = HardwareFingerprint([node_with(cpu_slots=0), node_with(cpu_slots=1, node_id="a"), node_with(cpu_slots=1)])
    again = HardwareFingerprint.from_dict(fp.to_dict())
    assert again.hardware_id == fp.hardware_id and again.devices_per_node == fp.devices_per_node
    assert again.node_ids == fp.node_ids


def test_ray_cluster_fingerprint_counts_declared_gpus_and_skips_the_head():
    """A simulated cluster: a head offering nothing, a CPU-only node and a node declaring 2 GPUs:
    the devices are the 2 GPUs of the one GPU node."""
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.cluster import cluster_fingerprint

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        gpu_node = cluster.add_node(num_cpus=1, num_gpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        fp = cluster_fingerprint()
        assert len(fp.nodes) == 3
        assert fp.device_kind == "cuda"
        assert fp.devices_per_node == [2]
        assert fp.node_ids == [gpu_node.node_id]
        assert fp.hardware_id.split("-")[1] == "n1"
    finally:
        ray.shutdown()
        cluster.shutdown()

import re

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

"""A job's `network` section: validation, the calibrated topology, the chunking decision in a plan."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.cluster import HardwareFingerprint, local_node_fingerprint
from orchestrator.jobfile import load_job
from policies.planning import chunking_decision, gradient_all_reduce_bytes, job_topology
from predictors import fit_performance_model
from predictors.network import NetworkError
from probes.vocabulary.jobspec import JobSpec, JobSpecError
from probes.vocabulary.ops import collective_params
from probes.vocabulary.records import Measurement


def job_dict(network, world=2) -> dict:
    return {
        "workload": "dlrm",
        "world_size": world,
        "batch_size": 32,
        "dense": {"num_dense_features": 4, "bottom_mlp": [16], "top_mlp": [8, 1]},
        "tables": [{"name": "t0", "num_embeddings": 1000, "embedding_dim": 8, "pooling_factor": 2}],
        "network": network,
    }


def write(tmp_path, data) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    "network, message",
    [
        ({"topology": "nope"}, "network.topology: unknown topology 'nope'"),
        ({"topology": "2D-SW_SW"}, "network: the topology has 1024 NPUs (16 x 64), the job's world_size is 2"),
        (
            {"dims": [{"peers": 2, "bandwidth_gbps": 1, "latency_us": 1, "algorithm": "torus"}]},
            "network.dims[0]: dim1.algorithm must be one of ring, direct, switch",
        ),
        ({"dims": [{"peers": 2}]}, "network.dims[0] lacks ['bandwidth_gbps', 'latency_us']"),
        ({"topology": "calibrated", "dims": []}, "network: give exactly one of topology"),
        (
            {"topology": "calibrated", "chunks": 4},
            "network.chunks: unknown field; allowed: topology, dims, collective_mb",
        ),
        ({"topology": "calibrated", "collective_mb": -1}, "network.collective_mb: expected a positive number of MiB"),
    ],
)
def test_bad_network_sections_name_the_field(tmp_path, network, message):
    with pytest.raises(JobSpecError) as exc:
        load_job(write(tmp_path, job_dict(network)))
    assert message in str(exc.value)


def test_explicit_dims_plan_the_gradient_all_reduce(tmp_path):
    network = {
        "dims": [
            {"peers": 2, "bandwidth_gbps": 8, "latency_us": 5, "algorithm": "ring"},
            {"peers": 2, "bandwidth_gbps": 1, "latency_us": 20, "algorithm": "ring"},
        ],
        "collective_mb": 8,
    }
    job = load_job(write(tmp_path, job_dict(network, world=4)))
    assert gradient_all_reduce_bytes(job) == 8 * 2**20
    assert JobSpec.from_dict(job.to_dict()).network == job.network  # kept through the plan's job record
    decision = chunking_decision(job, model=None, fingerprint=None)
    assert decision.policy == "chunking" and len(decision.candidates) == 30
    assert decision.choice_detail["chunk_schedule"]["dims"] == [2, 2]


def test_dense_gradient_bytes_are_the_default_size():
    job = JobSpec.from_dict(job_dict({"topology": "calibrated"}))
    assert gradient_all_reduce_bytes(job) == ((4 + 1) * 16 + (16 + 8 + 1) * 8 + (8 + 1) * 1) * 4


def measured_model(scopes: dict[str, int]):
    """A bundle with reduce-scatter curves: 20 us + bytes sent at 4 GB/s, per group."""
    rows = []
    for scope, world in scopes.items():
        for e in range(10, 25):
            nbytes = 2**e
            t = 20e-6 + (world - 1) / world * nbytes / 4e9
            rows.append(
                Measurement("reduce_scatter", collective_params("reduce_scatter", nbytes, world, scope), t, 0, 11)
            )
    model, _ = fit_performance_model(rows, "synthetic")
    return model


def test_calibrated_topology_comes_from_the_measured_collectives():
    node = local_node_fingerprint(cpu_slots=2)
    fingerprint = HardwareFingerprint(nodes=[node])
    job = JobSpec.from_dict(job_dict({"topology": "calibrated"}, world=len(node.devices)))
    topology = job_topology(job, measured_model({"intra": len(node.devices)}), fingerprint)
    assert topology.peers == (len(node.devices),)
    assert topology.dims[0].bandwidth_gbps == pytest.approx(4.0, rel=0.1)
    # Two nodes: intra then inter dimension; without inter-node measurements the error says so.
    two = HardwareFingerprint(nodes=[node, node])
    job = JobSpec.from_dict(job_dict({"topology": "calibrated"}, world=2 * len(node.devices)))
    with pytest.raises(NetworkError, match="calibrated needs measured reduce_scatter curves"):
        job_topology(job, measured_model({"intra": len(node.devices)}), two)

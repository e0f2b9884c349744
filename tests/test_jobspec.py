import pytest
import yaml
from conftest import EXAMPLE_JOB

from orchestrator.jobfile import load_job
from probes.vocabulary.jobspec import JobSpec, JobSpecError


def test_example_job_loads():
    job = load_job(EXAMPLE_JOB)
    assert job.workload == "dlrm" and job.world_size == 2
    assert len(job.tables) == 8
    assert job.tables[0].distribution.kind == "zipf" and job.tables[0].distribution.s == 1.05
    assert job.dense_layers()[0] == (13, 128)
    # top MLP reads the bottom output next to every pooled embedding
    assert job.dense_layers()[2][0] == 64 + sum(t.embedding_dim for t in job.tables)


def test_round_trip(tiny_job_dict):
    job = JobSpec.from_dict(tiny_job_dict)
    assert JobSpec.from_dict(job.to_dict()) == job


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(workload="gpt"), "workload: expected one of ['dlrm', 'transformer', 'sweep'], got 'gpt'"),
        (lambda d: d.pop("world_size"), "world_size: required field is missing"),
        (lambda d: d.update(batch_size=0), "batch_size: expected an integer >= 1, got 0"),
        (
            lambda d: d["tables"][2].update(distribution="normal"),
            "tables[2].distribution: expected 'uniform', {zipf: s} with s > 0, or {profile: name}",
        ),
        (lambda d: d["tables"][1].update(distribution={"zipf": -1}), "tables[1].distribution"),
        (lambda d: d["tables"][3].update(name="t0"), "tables[3].name: expected a name not used by another table"),
        (lambda d: d["tables"][0].pop("embedding_dim"), "tables[0].embedding_dim: required field is missing"),
        (lambda d: d["dense"].update(top_mlp=[16, 2]), "dense.top_mlp[-1]: expected 1 (the click logit), got 2"),
        (
            lambda d: d["dense"].update(bottom_mlp=[16, "x"]),
            "dense.bottom_mlp[1]: expected a positive integer, got 'x'",
        ),
        (lambda d: d.update(tables=[]), "tables: expected a non-empty list of tables"),
        (lambda d: d.update(batchsize=3), "batchsize: unknown field"),
        (lambda d: d.update(memory_cap_gb=-1), "memory_cap_gb: expected a positive number of GiB"),
    ],
)
def test_errors_name_the_field(tiny_job_dict, mutate, expected):
    mutate(tiny_job_dict)
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(tiny_job_dict)
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_all_problems_reported_at_once(tiny_job_dict):
    tiny_job_dict.update(world_size=0, batch_size=-3)
    tiny_job_dict["tables"][0]["pooling_factor"] = 0
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(tiny_job_dict)
    assert len(info.value.problems) == 3


def test_job_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"workload": "dlrm"}))
    with pytest.raises(JobSpecError) as info:
        load_job(bad)
    assert all(p.startswith(str(bad)) for p in info.value.problems)
    (tmp_path / "broken.yaml").write_text("tables: [unclosed")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job(tmp_path / "broken.yaml")
    with pytest.raises(JobSpecError, match="not found"):
        load_job(tmp_path / "missing.yaml")


def test_unknown_profile_table_names_the_choices():
    from probes.vocabulary.jobspec import JobSpec, JobSpecError

    data = {
        "workload": "dlrm",
        "world_size": 2,
        "batch_size": 8,
        "dense": {"num_dense_features": 4, "bottom_mlp": [8], "top_mlp": [1]},
        "tables": [
            {
                "name": "a",
                "num_embeddings": 10,
                "embedding_dim": 4,
                "pooling_factor": 1,
                "distribution": {"profile": "nope"},
            }
        ],
    }
    with pytest.raises(JobSpecError, match=r"tables\[0\]\.distribution.*power1\.1"):
        JobSpec.from_dict(data)

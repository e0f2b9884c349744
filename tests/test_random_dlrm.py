from probes.jobspec import JobSpec
from probes.workloads.random_dlrm import TABLES_PER_RANK, random_dlrm_job, random_dlrm_tasks


def test_tasks_are_valid_deterministic_and_sized_like_the_anchor():
    tasks = random_dlrm_tasks(20, world_size=2, seed=3, scale=0.05)
    assert [t.name for t in tasks] == [f"random{i}" for i in range(20)]
    assert random_dlrm_job(5, 2, seed=3, scale=0.05) == random_dlrm_job(5, 2, seed=3, scale=0.05)
    assert random_dlrm_job(5, 2, seed=3) != random_dlrm_job(5, 2, seed=4)
    for t in tasks:
        assert isinstance(t, JobSpec)
        assert 0.7 * 2 * TABLES_PER_RANK - 1 <= len(t.tables) <= 1.3 * 2 * TABLES_PER_RANK + 1
        assert all(100 <= tb.num_embeddings <= 100_000 for tb in t.tables)
    # The mix varies: several batch sizes, dims and distribution kinds across tasks.
    assert len({t.batch_size for t in tasks}) >= 3
    assert len({tb.embedding_dim for t in tasks for tb in t.tables}) == 4
    assert {tb.distribution.kind for t in tasks for tb in t.tables} == {"uniform", "zipf", "profile"}

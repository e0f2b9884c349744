"""Our plans as TorchRec ShardingPlans and back; TorchRec's planner as a plan of ours."""
import pytest

pytest.importorskip("torchrec")

from policies.torchrec_bridge import from_sharding_plan, to_sharding_plan, torchrec_plan  # noqa: E402
from probes.jobspec import JobSpec  # noqa: E402
from probes.table_shards import table_shards  # noqa: E402

MIXED = [1, {"type": "row_wise"}, {"type": "column_wise", "ranks": [1, 0]}, {"type": "data_parallel"}, 0]


@pytest.fixture
def job(tiny_job_dict):
    return JobSpec.from_dict(tiny_job_dict)


def test_a_plan_round_trips_through_a_torchrec_sharding_plan(job):
    sharding_plan = to_sharding_plan(job, MIXED)
    module_plan = sharding_plan.plan[""]
    assert {name: (ps.sharding_type, list(ps.ranks) if ps.ranks else None) for name, ps in module_plan.items()} == {
        "t0": ("table_wise", [1]), "t1": ("row_wise", [0, 1]), "t2": ("column_wise", [1, 0]),
        "t3": ("data_parallel", [0, 1]), "t4": ("table_wise", [0]),
    }
    # the column-wise table's shards split its 8 columns between the two ranks
    shards = module_plan["t2"].sharding_spec.shards
    assert sorted(s.shard_sizes[1] for s in shards) == [4, 4]
    assert from_sharding_plan(job, sharding_plan) == MIXED


def test_a_torchrec_plan_missing_a_table_is_refused(job):
    sharding_plan = to_sharding_plan(job, MIXED)
    del sharding_plan.plan[""]["t3"]
    with pytest.raises(ValueError, match="no entry for table 't3'"):
        from_sharding_plan(job, sharding_plan)


def test_torchrecs_planner_places_every_table_within_the_cap(job):
    plan = torchrec_plan(job, memory_cap_bytes=2**30)
    assert len(plan) == len(job.tables)
    table_shards(job, plan)  # a valid plan of ours: every table placed or split completely
    assert torchrec_plan(job, memory_cap_bytes=2**30) == plan  # the planner is deterministic

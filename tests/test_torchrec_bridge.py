"""Our plans as TorchRec ShardingPlans and back; TorchRec's planner as a plan of ours."""

import json

import pytest

pytest.importorskip("torchrec")

from policies.torchrec_bridge import torchrec_plan  # noqa: E402
from policies.torchrec_plans import from_sharding_plan, load_torchrec_plan, to_sharding_plan, torchrec_plan_record  # noqa: E402
from probes.vocabulary.jobspec import JobSpec  # noqa: E402
from probes.vocabulary.placement import RankPlacement  # noqa: E402
from probes.vocabulary.table_shards import table_shards  # noqa: E402

MIXED = [1, {"type": "row_wise"}, {"type": "column_wise", "ranks": [1, 0]}, {"type": "data_parallel"}, 0]


@pytest.fixture
def job(tiny_job_dict):
    return JobSpec.from_dict(tiny_job_dict)


def test_a_plan_round_trips_through_a_torchrec_sharding_plan(job):
    sharding_plan = to_sharding_plan(job, MIXED)
    module_plan = sharding_plan.plan[""]
    assert {name: (ps.sharding_type, list(ps.ranks) if ps.ranks else None) for name, ps in module_plan.items()} == {
        "t0": ("table_wise", [1]),
        "t1": ("row_wise", [0, 1]),
        "t2": ("column_wise", [1, 0]),
        "t3": ("data_parallel", [0, 1]),
        "t4": ("table_wise", [0]),
    }
    # the column-wise table's shards split its 8 columns between the two ranks
    shards = module_plan["t2"].sharding_spec.shards
    assert sorted(s.shard_sizes[1] for s in shards) == [4, 4]
    assert from_sharding_plan(job, sharding_plan) == MIXED


def test_the_plan_file_is_plain_json_and_loads_as_the_same_sharding_plan(job):
    record = json.loads(json.dumps(torchrec_plan_record(job, MIXED)))
    loaded = load_torchrec_plan(record)
    direct = to_sharding_plan(job, MIXED)
    assert str(loaded) == str(direct)
    assert from_sharding_plan(job, loaded) == MIXED


def test_the_plan_file_knows_which_ranks_share_a_node(tiny_job_dict):
    """Two nodes of two ranks: TorchRec's local size is 2, and a row-wise table spans all 4 ranks."""
    job = JobSpec.from_dict({**tiny_job_dict, "world_size": 4})
    plan = [3, {"type": "row_wise"}, {"type": "column_wise", "ranks": [2, 1]}, {"type": "data_parallel"}, 0]
    record = torchrec_plan_record(job, plan, RankPlacement((0, 0, 1, 1)))
    assert record["local_world_size"] == 2 and record["world_size"] == 4
    module_plan = load_torchrec_plan(record).plan[""]
    assert sorted(module_plan["t1"].ranks) == [0, 1, 2, 3]
    assert from_sharding_plan(job, load_torchrec_plan(record)) == plan


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda r: r.update(format="x"), "format"),
        (lambda r: r["tables"]["t0"].update(sharding_type="grid_wise"), "tables.t0.sharding_type"),
        (lambda r: r["tables"].pop("t4"), "tables"),
    ],
)
def test_a_bad_plan_file_is_refused_naming_the_field(job, change, field):
    record = torchrec_plan_record(job, MIXED)
    change(record)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        load_torchrec_plan(record)


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


def test_the_measured_estimator_prices_shards_with_our_models(job):
    """A TorchRec shard's perf comes from our PerformanceModel: a table-wise shard's forward is
    the embedding model's lookup of that table over the global batch, in milliseconds."""
    from types import SimpleNamespace

    from test_sharding import synthetic_model
    from torchrec.distributed.planner.types import Shard

    from policies.torchrec_bridge import measured_estimator
    from probes.vocabulary.tbe_features import expected_features

    model = synthetic_model()
    t = job.tables[2]
    tw = SimpleNamespace(
        name=t.name,
        batch_size=job.batch_size,
        sharding_type="table_wise",
        shards=[Shard(size=[t.num_embeddings, t.embedding_dim], offset=[0, 0])],
    )
    dp = SimpleNamespace(
        name=t.name,
        batch_size=job.batch_size,
        sharding_type="data_parallel",
        shards=[Shard(size=[t.num_embeddings, t.embedding_dim], offset=[0, 0]) for _ in range(2)],
    )
    measured_estimator(job, model, 2).estimate([tw, dp])
    feats = expected_features([t.shape], 2 * job.batch_size, seed=job.seed)
    assert tw.shards[0].perf.fwd_compute == pytest.approx(1e3 * model.predict("embedding_fwd", **feats))
    assert tw.shards[0].perf.fwd_comms > 0 and tw.shards[0].perf.bwd_comms == tw.shards[0].perf.fwd_comms
    # a replica looks up the local batch only and has no forward exchange, but all-reduces its gradient
    assert dp.shards[0].perf.fwd_compute < tw.shards[0].perf.fwd_compute
    assert dp.shards[0].perf.fwd_comms == 0 and dp.shards[0].perf.bwd_comms > 0


def test_torchrecs_planner_runs_on_our_measured_costs(job):
    from test_sharding import synthetic_model

    plan = torchrec_plan(job, memory_cap_bytes=2**30, model=synthetic_model())
    table_shards(job, plan)
    # this bundle has no reduce-scatter model, so no table is offered row-wise
    assert not any(isinstance(e, dict) and e["type"] == "row_wise" for e in plan)


def test_the_policy_ranks_torchrecs_plans_among_its_candidates(job):
    from test_sharding import synthetic_model

    from policies.sharding import TORCHREC, TORCHREC_MEASURED, choose_sharding

    decision = choose_sharding(job, synthetic_model(), memory_cap_bytes=2**30)
    by_name = {c.name: c for c in decision.candidates}
    assert {TORCHREC, TORCHREC_MEASURED} <= set(by_name)
    assert by_name[TORCHREC].detail["table_to_rank"] == torchrec_plan(job, memory_cap_bytes=2**30)
    # the policy's choice is never predicted slower than TorchRec's plan when that one is priced
    if by_name[TORCHREC].feasible:
        assert decision.predicted_ms <= by_name[TORCHREC].predicted_ms

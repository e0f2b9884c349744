"""Planning at scale takes short cuts that must not change a prediction: a transformer layout
simulated as one rank (a pipeline as one data-parallel replica), op prices remembered across ranks, a table's reuse statistics
computed instead of drawn for large batches, TorchRec's planner left out past its bound."""

from __future__ import annotations

import numpy as np
import pytest

from policies.sharding import TORCHREC, TORCHREC_MAX_TABLE_RANKS, TORCHREC_MEASURED, ShardingPolicy
from predictors.dlrm_graph import build_dlrm_graph
from predictors.simulator import model_cost, simulate
from predictors.transformer_graph import build_transformer_graph, stage_representatives
from probes.vocabulary.indices import Distribution, reuse_counts, sample_indices
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.placement import RankPlacement
from probes.vocabulary.reuse_expectation import expected_reuse
from probes.vocabulary.reuse_profile import load_profile
from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.random_dlrm import random_dlrm_job

BASE = dict(layers=4, hidden=32, heads=4, seq_len=8, batch_size=8, dropout=0.1)


def scoped_cost(op) -> float:
    """Sensitive to every param a rank's ops differ in: size, group size and scope."""
    if not op.params:
        return 0.0
    p = op.params
    size = p.get("bytes", 0) + p.get("flops", 0) / 50 + p.get("rows", 0) * p.get("cols", 0)
    return 1e-6 * (1 + size / 1e5) * (3.0 if p.get("scope") == "inter" else 1.0) * (1 + 0.1 * p.get("world", 0))


@pytest.mark.parametrize(
    "kw",
    [
        dict(world_size=32),
        dict(world_size=32, tensor_parallel=4),
        dict(world_size=32, tensor_parallel=2, micro_batches=4, recompute=True),
        dict(world_size=32, fsdp="full_shard", micro_batches=2),
        dict(world_size=32, fsdp="shard_grad_op"),
        dict(world_size=64, tensor_parallel=4, micro_batches=2),
        # pipelines: one data-parallel replica, its TP groups whole (stages across nodes too)
        dict(world_size=16, tensor_parallel=2, pipeline_parallel=2, micro_batches=2),
        dict(world_size=32, pipeline_parallel=2, micro_batches=4),
        dict(world_size=32, tensor_parallel=4, pipeline_parallel=4, micro_batches=4),
        dict(world_size=64, tensor_parallel=2, pipeline_parallel=4, micro_batches=8, recompute=True),
    ],
)
@pytest.mark.parametrize("synchronous", [True, False])
def test_a_folded_layout_simulates_as_the_whole_world(kw, synchronous):
    spec = TransformerSpec(**{**BASE, **kw})
    placement = RankPlacement.packed(spec.world_size, [8] * (spec.world_size // 8))
    whole = simulate(build_transformer_graph(spec, placement), scoped_cost, synchronous=synchronous)
    folded_graph = build_transformer_graph(spec, placement, fold=True)
    piped = spec.pipeline_parallel > 1
    assert folded_graph.world_size == (spec.tensor_parallel * spec.pipeline_parallel if piped else 1)
    assert folded_graph.meta["folded"]["world_size"] == spec.world_size
    folded = simulate(folded_graph, scoped_cost, synchronous=synchronous)
    assert folded.iteration_s == pytest.approx(whole.iteration_s, rel=1e-12)


def test_a_pipeline_keeps_its_first_replica_with_whole_tp_groups():
    spec = TransformerSpec(
        **{**BASE, "world_size": 16, "tensor_parallel": 2, "pipeline_parallel": 2, "micro_batches": 2}
    )
    # stage width 8: stage 0 is ranks 0-7, stage 1 ranks 8-15; replica 0 is each stage's first TP pair
    assert stage_representatives(spec, RankPlacement.packed(16, [8, 8])) == (0, 1, 8, 9)


def test_a_placement_that_splits_groups_unevenly_is_not_folded():
    spec = TransformerSpec(**{**BASE, "world_size": 12, "tensor_parallel": 2})
    # nodes of 3 devices: some TP pairs straddle two nodes, others do not
    placement = RankPlacement.packed(12, [3, 3, 3, 3])
    assert stage_representatives(spec, placement) is None
    graph = build_transformer_graph(spec, placement, fold=True)
    assert graph.world_size == 12 and "folded" not in graph.meta


class _Model:
    """A stand-in bundle: prices from params alone, counting the calls."""

    models = {
        "gemm": None,
        "embedding_fwd": None,
        "embedding_bwd": None,
        "all_to_all": None,
        "all_reduce": None,
        "reduce_scatter": None,
        "all_gather": None,
        "relu": None,
        "mul": None,
        "add": None,
        "memcpy": None,
    }
    in_step = None
    synchronous = True

    def __init__(self) -> None:
        self.calls = 0

    def predict_params(self, op: str, params: dict) -> float:
        self.calls += 1
        return scoped_cost(type("Op", (), {"params": params})()) + 1e-7 * len(op)


def test_remembered_prices_equal_the_models_own():
    spec = JobSpec.from_dict(random_dlrm_job(3, 8, seed=1, scale=0.01))
    graph = build_dlrm_graph(spec, [i % 8 for i in range(len(spec.tables))])
    model = _Model()
    cost = model_cost(model, set())
    direct = _Model()
    for ops in graph.ranks:
        for op in ops:
            assert cost(op) == direct.predict_params(op.op, op.params) if op.params else cost(op) == 0.0
    assert model.calls < direct.calls  # the dense layers' ops are priced once for all ranks


@pytest.mark.parametrize(
    "dist", [Distribution("uniform"), Distribution("zipf", 1.05), Distribution("zipf", 0.6), "profile"]
)
@pytest.mark.parametrize("rows, ids", [(50_000, 2**18), (3_000_000, 2**19)])
def test_expected_reuse_is_the_mean_of_draws(dist, rows, ids):
    if dist == "profile":
        dist = Distribution("profile", table=load_profile().names[0])
    rng = np.random.default_rng(0)
    draws = [reuse_counts(sample_indices(rows, ids, dist, rng, unordered=True)) for _ in range(3)]
    distinct = np.mean([d for d, _ in draws])
    bins = np.mean([b for _, b in draws], axis=0)
    expected_distinct, expected_bins = expected_reuse(rows, ids, dist)
    assert expected_distinct == pytest.approx(distinct, rel=0.01)
    share = np.asarray(expected_bins) / sum(expected_bins)
    assert np.abs(share - bins / bins.sum()).sum() < 0.02


def test_torchrec_planner_left_out_past_its_bound_with_the_reason():
    world = 8
    tables = TORCHREC_MAX_TABLE_RANKS // world + 1
    job = random_dlrm_job(0, world, seed=0, scale=0.001)
    job["tables"] = [{**job["tables"][0], "name": f"t{i}"} for i in range(tables)]
    policy = ShardingPolicy(JobSpec.from_dict(job), model=None, memory_cap_bytes=2**40)  # type: ignore[arg-type]
    names = [name for name, _ in policy.options()]
    refused = {c.name: c.detail["reason"] for c in policy.refused}
    assert TORCHREC not in names and TORCHREC_MEASURED not in names
    assert "table-ranks" in refused[TORCHREC] and str(tables) in refused[TORCHREC_MEASURED]


def test_search_tries_the_lightest_ranks_first():
    from policies.sharding_search import rank_loads, table_moves

    job = random_dlrm_job(0, 4, seed=0, scale=0.001)
    job["tables"] = [{**job["tables"][0], "name": f"t{i}", "pooling_factor": 1 + i} for i in range(6)]
    spec = JobSpec.from_dict(job)
    plan = [0, 1, 0, 2, 2, 2]  # pooling 1..6: rank 3 holds nothing, rank 1 2, rank 0 1 + 3, rank 2 4 + 5 + 6
    loads = rank_loads(spec, plan)
    assert loads[3] == 0 and loads[1] < loads[0] < loads[2]
    assert table_moves(spec, 5, plan[5], loads)[:3] == [3, 1, 0]


@pytest.mark.parametrize("synchronous", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_dlrm_simulated_on_its_dominant_ranks_takes_the_whole_worlds_time(seed, synchronous):
    from predictors.dlrm_ranks import dominant_ranks, lookup_times
    from probes.vocabulary.table_shards import table_shards

    world = 16
    spec = JobSpec.from_dict(random_dlrm_job(seed, world, seed=seed, scale=0.01))
    rng = np.random.default_rng(seed)
    plan: list = [int(r) for r in rng.integers(0, world, size=len(spec.tables))]
    plan[0] = {"type": "row_wise"}
    plan[1] = {"type": "column_wise", "ranks": [0, 1]}
    plan[2] = {"type": "data_parallel"}
    placement = RankPlacement.packed(world, [8, 8])
    cost = model_cost(_Model(), set())
    ranks = dominant_ranks(lookup_times(spec, table_shards(spec, plan), cost))
    assert 0 < len(ranks) < world
    whole = simulate(build_dlrm_graph(spec, plan, placement), cost, synchronous=synchronous)
    few = simulate(build_dlrm_graph(spec, plan, placement, ranks=ranks), cost, synchronous=synchronous)
    assert few.iteration_s == pytest.approx(whole.iteration_s, rel=1e-12)


def test_layouts_priced_with_shared_prices_equal_each_priced_alone():
    from synthetic_rows import gemm_bundle

    from predictors.transformer_estimator import estimate_transformer_iteration

    model = gemm_bundle(300)
    memo: dict = {}
    for kw in (dict(), dict(tensor_parallel=2), dict(pipeline_parallel=2, micro_batches=2)):
        spec = TransformerSpec(**{**BASE, "world_size": 8, **kw})
        shared = estimate_transformer_iteration(spec, model, memo=memo)
        alone = estimate_transformer_iteration(spec, model)
        assert shared.iteration_s == alone.iteration_s and shared.kernel_sum_s == alone.kernel_sum_s
    assert memo

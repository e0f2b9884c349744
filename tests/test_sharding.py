import numpy as np
import pytest
from synthetic_rows import fitted_once, gemm_rows

from policies.sharders import SHARDERS, NoFeasiblePlanError, rank_memory
from policies.sharding import choose_sharding
from predictors import PerformanceModel, fit_performance_model
from predictors.dlrm_estimator import estimate_iteration
from predictors.memory import dlrm_memory
from probes.vocabulary.jobspec import JobSpec, TableShape
from probes.vocabulary.ops import collective_params
from probes.vocabulary.records import Measurement
from probes.vocabulary.tbe_features import expected_features


@fitted_once
def synthetic_model() -> PerformanceModel:
    """A bundle fitted on synthetic rows with known costs: lookups cost, so balance matters."""
    rng = np.random.default_rng(0)
    rows = gemm_rows(rng, 40)
    for i in range(40):
        tables = [
            TableShape(int(rng.integers(1000, 100_000)), int(rng.choice([8, 16, 64])), int(rng.integers(1, 32)))
            for _ in range(int(rng.integers(1, 9)))
        ]
        p = expected_features(tables, int(rng.integers(64, 2048)), seed=i)
        for op in ("embedding_fwd", "embedding_bwd"):
            rows.append(Measurement(op, p, 1e-5 + p["gathered_elems"] / 1e9, 0, 5))
    for op in ("all_reduce", "all_to_all"):
        for e in range(2, 27):
            rows.append(Measurement(op, collective_params(op, 2**e, 2), 30e-6 + 2**e / 2e9, 0, 11))
    # two judge folds, not five: the models fitted on every row are the same (the folds only
    # score them), and the tests that use this bundle price with its models, never its scores
    model, _ = fit_performance_model(rows, "synthetic", folds=2)
    return model


@pytest.fixture(scope="module")
def model():
    return synthetic_model()


def job(tables, world=2, cap=None, bottom=(16,)):
    return JobSpec.from_dict(
        {
            "workload": "dlrm",
            "world_size": world,
            "batch_size": 64,
            "memory_cap_gb": cap,
            "dense": {"num_dense_features": 4, "bottom_mlp": list(bottom), "top_mlp": [8, 1]},
            "tables": [
                {"name": f"t{i}", "num_embeddings": e, "embedding_dim": d, "pooling_factor": pooling}
                for i, (e, d, pooling) in enumerate(tables)
            ],
        }
    )


@pytest.mark.parametrize("name", sorted(SHARDERS))
def test_every_table_placed_exactly_once_within_memory(name):
    rng = np.random.default_rng(7)
    spec = job(
        [(int(rng.integers(100, 100_000)), int(rng.choice([8, 16, 32])), int(rng.integers(1, 20))) for _ in range(23)],
        world=4,
    )
    cap = sum(t.bytes for t in spec.tables) / 2  # tight enough to matter, loose enough to fit
    placement = SHARDERS[name](spec.tables, 4, cap, seed=0)
    assert len(placement) == len(spec.tables)
    assert all(0 <= r < 4 for r in placement)
    if name not in ("naive", "random"):  # the greedy sharders honour the cap themselves
        assert max(rank_memory(spec.tables, placement, 4)) <= cap


def test_greedy_sharders_balance_their_proxy():
    spec = job([(1000, 16, 10)] * 4 + [(1000, 16, 1)] * 4)
    placement = SHARDERS["lookup_greedy"](spec.tables, 2, float("inf"))
    heavy = [placement[i] for i in range(4)]
    assert sorted(heavy) == [0, 0, 1, 1]


def test_policy_picks_the_predicted_fastest_and_ranks_all(model):
    spec = job([(50_000, 64, 30)] * 2 + [(1000, 8, 1)] * 6)
    decision = choose_sharding(spec, model, memory_cap_bytes=float("inf"), torchrec=False)
    feasible = [c for c in decision.candidates if c.feasible]
    assert {c.name for c in decision.candidates} == set(SHARDERS) | {"all_row_wise", "all_column_wise", "search"}
    # this bundle has no reduce-scatter model: row-wise plans are refused, not priced at zero
    all_rw = next(c for c in decision.candidates if c.name == "all_row_wise")
    assert not all_rw.feasible and "cannot be priced" in all_rw.detail["reason"]
    # fastest first; times equal to 1e-9 ms are ties, which go to the earlier candidate
    # (`policies.policy.ranked`): two plans that price the same may differ in the last bits
    assert [round(c.predicted_ms, 9) for c in feasible] == sorted(round(c.predicted_ms, 9) for c in feasible)
    assert decision.choice == feasible[0].name
    # The two heavy tables must end up on different ranks in the chosen plan.
    placement = decision.choice_detail["table_to_rank"]
    assert placement[0] != placement[1]
    naive = next(c for c in decision.candidates if c.name == "naive")
    assert decision.predicted_ms <= naive.predicted_ms
    cost = estimate_iteration(spec, placement, model)
    assert cost.iteration_s * 1e3 == pytest.approx(decision.predicted_ms)


def test_memory_cap_filters_candidates_and_fails_clearly(model):
    spec = job([(1_000_000, 64, 1)] * 4)  # 256 MB each
    gib = 2**30
    ok = choose_sharding(spec, model, memory_cap_bytes=0.5 * gib, torchrec=False)
    for c in ok.candidates:
        if c.feasible:
            assert max(c.detail["rank_memory_bytes"]) <= 0.5 * gib
    with pytest.raises(NoFeasiblePlanError, match="fits on no rank under the cap"):
        choose_sharding(spec, model, memory_cap_bytes=0.2 * gib, torchrec=False)


def test_choice_is_deterministic_for_a_seed(model):
    rng = np.random.default_rng(3)
    spec = job([(int(rng.integers(1000, 90_000)), 16, int(rng.integers(1, 30))) for _ in range(12)])
    a = choose_sharding(spec, model, float("inf"), seed=5, torchrec=False)
    b = choose_sharding(spec, model, float("inf"), seed=5, torchrec=False)
    for decision in (a, b):  # the search's wall time is the one thing allowed to differ
        search = next(c for c in decision.candidates if c.name == "search").detail["search"]
        assert not search.pop("exhausted") and search.pop("seconds") > 0
    assert a == b


def test_step_overhead_learns_each_kernel_class_s_in_step_slowdown(model):
    """Steps measured as their kernels, plus 5% of the busiest rank's GEMMs, 50% of its
    memory-bound kernels and its collectives once more, plus 0.3 ms per table: the fitted
    overhead recovers every term, so held-out steps of other mixes are predicted exactly. One
    slowdown on all the kernels could not: it would miss the dense-heavy and the table-heavy.
    The split is a candidate (`CANDIDATE_FEATURES`), fitted here as a benchmark's "with" does."""
    from predictors.dlrm_estimator import CANDIDATE_FEATURES, fit_overhead
    from predictors.kernel_classes import COLLECTIVE, GEMM, KERNEL_CLASSES, MEMORY
    from probes.vocabulary.ops import DLRM_STEP_OP

    rng = np.random.default_rng(7)
    rows = []
    for i in range(15):
        tables = [
            (int(rng.integers(1000, 200_000)), int(rng.choice([8, 64])), int(rng.integers(1, 40)))
            for _ in range(int(rng.integers(2, 12)))
        ]
        spec = job(tables, bottom=[int(rng.choice([16, 256, 1024]))])
        placement = [t % 2 for t in range(len(tables))]
        kernels = estimate_iteration(spec, placement, model, include_overhead=False)
        classes = kernels.overhead_params
        assert classes[GEMM] > 0 and classes[MEMORY] > 0 and classes[COLLECTIVE] > 0
        slowdown = 0.05 * classes[GEMM] + 0.5 * classes[MEMORY] + 1.0 * classes[COLLECTIVE]
        rows.append(
            Measurement(
                DLRM_STEP_OP,
                {"job": spec.to_dict(), "table_to_rank": placement},
                kernels.iteration_s + slowdown + 3e-4 * len(tables),
                0.0,
                20,
            )
        )
    assert set(KERNEL_CLASSES) <= set(CANDIDATE_FEATURES)
    bundle = type(model)(model.hardware_id, dict(model.models))
    judged = fit_overhead(bundle, rows, features=["one", "tables_total", *KERNEL_CLASSES])
    overhead = bundle.step_overheads["dlrm"]
    coef = dict(zip(overhead.features, overhead.coef))
    assert coef[GEMM] == pytest.approx(0.05, rel=0.1) and coef[MEMORY] == pytest.approx(0.5, rel=0.05)
    assert coef[COLLECTIVE] == pytest.approx(1.0, rel=0.05)
    assert coef["tables_total"] == pytest.approx(3e-4, rel=0.05)
    stats = bundle.metrics[DLRM_STEP_OP]  # every step judged by an overhead fitted without it
    assert judged == rows and stats["judged"] == "leave-one-out" and stats["n"] == len(rows)
    assert stats["gmae"] < 0.01 and stats["gmae_low"] <= stats["gmae"] <= stats["gmae_high"]
    assert stats["baseline_gmae"] > 0.2  # the kernels alone miss the slowdowns and the per-table term
    assert "dlrm" not in model.step_overheads  # the shared fixture is untouched


def test_step_overhead_tells_a_slowdown_by_what_runs_alongside_from_one_by_the_busiest_rank_alone(model):
    """Steps slowed by half of the busiest rank's memory-bound time that the other rank runs
    beside it (a shared memory system), some with every table on one rank (little runs beside
    its lookups), some balanced: an overhead fitted with the candidate `memory_alongside_s` puts
    the slowdown on it, not on the busiest rank's memory-bound time, so a lopsided plan is not
    priced as a balanced one. A rank on another node runs nothing beside it."""
    from predictors.dlrm_estimator import CANDIDATE_FEATURES, OVERHEAD_FEATURES, fit_overhead
    from predictors.dlrm_ranks import memory_alongside
    from predictors.kernel_classes import MEMORY, MEMORY_ALONGSIDE
    from probes.vocabulary.ops import DLRM_STEP_OP
    from probes.vocabulary.placement import RankPlacement

    rng = np.random.default_rng(5)
    rows, lopsided = [], []
    for i in range(18):
        tables = [
            (int(rng.integers(1000, 200_000)), int(rng.choice([8, 64])), int(rng.integers(1, 40)))
            for _ in range(int(rng.integers(2, 12)))
        ]
        spec = job(tables, bottom=[int(rng.choice([16, 256]))])
        placement = [0] * len(tables) if i % 3 == 0 else [t % 2 for t in range(len(tables))]
        kernels = estimate_iteration(spec, placement, model, include_overhead=False)
        params = kernels.overhead_params
        lopsided.append(params[MEMORY_ALONGSIDE] / params[MEMORY])
        rows.append(
            Measurement(
                DLRM_STEP_OP,
                {"job": spec.to_dict(), "table_to_rank": placement},
                kernels.iteration_s + 0.5 * params[MEMORY_ALONGSIDE] + 3e-4 * len(tables),
                0.0,
                20,
            )
        )
    assert min(lopsided[::3]) < 0.7 < max(lopsided[1::3])  # the plans do differ in what runs alongside
    bundle = type(model)(model.hardware_id, dict(model.models))
    fit_overhead(bundle, rows, features=[*OVERHEAD_FEATURES, *CANDIDATE_FEATURES])  # the benchmark's "with"
    coef = dict(zip(bundle.step_overheads["dlrm"].features, bundle.step_overheads["dlrm"].coef))
    assert (
        MEMORY_ALONGSIDE not in OVERHEAD_FEATURES
        and coef[MEMORY_ALONGSIDE] == pytest.approx(0.5, rel=0.05)
        and abs(coef[MEMORY]) < 0.02
    )
    assert bundle.metrics[DLRM_STEP_OP]["gmae"] < 0.01
    lookups = [(1e-3, 2e-3), (0.5e-3, 0.5e-3), (1e-3, 2e-3)]
    assert memory_alongside(0, 4e-3, lookups, RankPlacement((0, 0, 0))) == pytest.approx(2e-3 + 4e-3)
    assert memory_alongside(0, 4e-3, lookups, RankPlacement((0, 0, 1))) == pytest.approx(2e-3)


def test_step_overhead_learns_a_cost_per_pooled_embedding_element(model):
    """Steps measured as their kernels + 20 ns per pooled embedding element (batch x summed
    dims: the exchange's splits and concatenations, which no probed kernel carries): the fitted
    overhead puts the time on that term, not on the kernels or the tables, so a job with other
    dims is priced right. Before the term, every stored DLRM run leaned ~1.2 ms a step low. A
    candidate now (`CANDIDATE_FEATURES`): fitted as a benchmark's "with" is, beside the default."""
    from predictors.dlrm_estimator import CANDIDATE_FEATURES, OVERHEAD_FEATURES, fit_overhead
    from probes.vocabulary.ops import DLRM_STEP_OP

    rng = np.random.default_rng(11)
    rows = []
    for _ in range(15):
        tables = [
            (int(rng.integers(1000, 200_000)), int(rng.choice([8, 32, 128])), int(rng.integers(1, 40)))
            for _ in range(int(rng.integers(2, 12)))
        ]
        spec = job(tables)
        placement = [t % 2 for t in range(len(tables))]
        kernels = estimate_iteration(spec, placement, model, include_overhead=False).iteration_s
        pooled = spec.batch_size * sum(t.embedding_dim for t in spec.tables)
        rows.append(
            Measurement(
                DLRM_STEP_OP, {"job": spec.to_dict(), "table_to_rank": placement}, kernels + 2e-8 * pooled, 0.0, 20
            )
        )
    assert "pooled_elems" in CANDIDATE_FEATURES and "pooled_elems" not in OVERHEAD_FEATURES
    bundle = type(model)(model.hardware_id, dict(model.models))
    fit_overhead(bundle, rows, features=[*OVERHEAD_FEATURES, "pooled_elems"])
    coef = dict(zip(bundle.step_overheads["dlrm"].features, bundle.step_overheads["dlrm"].coef))
    assert coef["pooled_elems"] == pytest.approx(2e-8, rel=0.02)
    assert coef["kernels_s"] < 0.01 and coef["tables_total"] < 1e-6
    assert bundle.metrics[DLRM_STEP_OP]["gmae"] < 0.01
    # the paired "before", the default features: without the term it misses
    without = type(model)(model.hardware_id, dict(model.models))
    fit_overhead(without, rows)
    assert "pooled_elems" not in without.step_overheads["dlrm"].features
    assert without.metrics[DLRM_STEP_OP]["gmae"] > bundle.metrics[DLRM_STEP_OP]["gmae"]


def _named_steps(model, kind: str, count: int, line, seed: int) -> list:
    """`count` DLRM steps of jobs named as the calibration names its `kind` of probe, each
    measured as `line(kernels_s, tables)` seconds."""
    from probes.vocabulary.ops import DLRM_STEP_OP

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        tables = [
            (int(rng.integers(1000, 200_000)), int(rng.choice([8, 64])), int(rng.integers(1, 40)))
            for _ in range(int(rng.integers(2, 12)))
        ]
        spec = job(tables, bottom=[int(rng.choice([16, 256]))])
        placement = [t % 2 for t in range(len(tables))]
        kernels = estimate_iteration(spec, placement, model, include_overhead=False).iteration_s
        named = {**spec.to_dict(), "name": f"{kind}{2 * i + 1}"}
        rows.append(
            Measurement(DLRM_STEP_OP, {"job": named, "table_to_rank": placement}, line(kernels, len(tables)), 0.0, 20)
        )
    return rows


def test_dlrm_step_overhead_is_fitted_on_the_task_shaped_steps(model):
    """Task steps that leave 3 ms + 0.3 ms a table + 20% of their kernels, and light steps on
    another line (0.5 ms + their kernels once more): the overhead is fitted on the task steps
    and recovers their line, as a production-shaped job is priced; the light steps are counted
    (`steps_measured`), not fitted. Fitted on every step (a benchmark's paired "before") it
    misses the tasks' line. With fewer task steps than the features need, every step is fitted."""
    from predictors.step_fit import fit_steps
    from probes.vocabulary.ops import DLRM_STEP_OP

    tasks = _named_steps(model, "task", 10, lambda k, t: k + 3e-3 + 3e-4 * t + 0.2 * k, seed=3)
    light = _named_steps(model, "light", 10, lambda k, t: k + 5e-4 + 1.0 * k, seed=4)
    bundle = type(model)(model.hardware_id, dict(model.models))
    fit_steps(bundle, tasks + light, [], seed=0)
    coef = dict(zip(bundle.step_overheads["dlrm"].features, bundle.step_overheads["dlrm"].coef))
    assert coef["one"] == pytest.approx(3e-3, rel=0.05) and coef["tables_total"] == pytest.approx(3e-4, rel=0.05)
    assert coef["kernels_s"] == pytest.approx(0.2, rel=0.05)
    stats = bundle.metrics[DLRM_STEP_OP]
    assert stats["n"] == 10 and stats["steps_measured"] == 20 and stats["gmae"] < 0.01

    every = type(model)(model.hardware_id, dict(model.models))
    fit_steps(every, tasks + light, [], seed=0, every_dlrm_step=True)
    assert every.metrics[DLRM_STEP_OP]["n"] == 20
    assert abs(every.step_overheads["dlrm"].coef[0] - 3e-3) > 3e-4  # the light steps pull the constant off

    few = type(model)(model.hardware_id, dict(model.models))
    fit_steps(few, tasks[:5] + light, [], seed=0)  # 5 < 4 features + 2 spare: every step
    assert few.metrics[DLRM_STEP_OP]["n"] == 15


def test_leave_one_out_judges_each_step_without_its_own_residual():
    """Overheads of 1, 1, 1 and 5 ms: a mean fitted on all four would predict the odd step
    from its own residual; left out, it is predicted at 1 ms (the mean of the others)."""
    from predictors.evaluation import leave_one_out

    class Mean:
        def __init__(self, rows):
            self.value = sum(r.median_s for r in rows) / len(rows)

        def predict(self, params):
            return self.value

    residuals = [Measurement("dlrm_overhead", {}, s, 0.0, 5) for s in (1e-3, 1e-3, 1e-3, 5e-3)]
    kernels = [4e-3] * 4
    measured = [k + r.median_s for k, r in zip(kernels, residuals)]
    stats = leave_one_out(residuals, kernels, measured, Mean)
    assert stats.n == 4
    assert stats.mape == pytest.approx((3 * (4 / 3e3) / 5e-3 + 4e-3 / 9e-3) / 4, rel=1e-3)


def test_a_plan_whose_predicted_peak_exceeds_the_device_is_infeasible(model):
    """Tables far under the weights cap, but a batch whose activations need more than the
    device has: every placement is refused with the predicted peak in the reason."""
    spec = job([(1000, 64, 4)] * 4)
    peak = max(dlrm_memory(spec, [0, 0, 1, 1], r).peak for r in range(2))
    fits = choose_sharding(spec, model, memory_cap_bytes=2**30, device_memory_bytes=2 * peak, torchrec=False)
    assert all(c.feasible for c in fits.candidates if "cannot be priced" not in c.detail.get("reason", ""))
    with pytest.raises(NoFeasiblePlanError, match="predicted peak .* exceeds the device's"):
        choose_sharding(spec, model, memory_cap_bytes=2**30, device_memory_bytes=0.5 * peak, torchrec=False)


def test_search_splits_a_table_that_no_whole_table_placement_can_balance(model):
    """One table carries most of the lookups: every table-wise plan leaves one rank with it.
    From the best classic sharder the search must split it (column-wise: this bundle has no
    row-wise collectives) and beat every sharder; the plan still covers every table."""
    from policies.sharding import PlanPricer
    from policies.sharding_search import local_search
    from probes.vocabulary.table_shards import table_shards

    spec = job([(200_000, 64, 60)] + [(2000, 8, 2)] * 5)
    decision = choose_sharding(spec, model, memory_cap_bytes=float("inf"), seed=1, torchrec=False)
    sharders = [c for c in decision.candidates if c.name in SHARDERS and c.feasible]
    best = min(sharders, key=lambda c: c.predicted_ms)
    result = local_search(spec, best.detail["table_to_rank"], PlanPricer(spec, model, float("inf")).seconds, seed=1)
    assert result.predicted_s * 1e3 < best.predicted_ms and result.moves
    assert isinstance(result.plan[0], dict) and result.plan[0]["type"] == "column_wise"
    assert decision.predicted_ms <= result.predicted_s * 1e3 + 1e-9  # the policy keeps the best it saw
    assert next(c for c in decision.candidates if c.name == "search").detail["search"]["started_from"]
    shards = table_shards(spec, result.plan)
    for i, t in enumerate(spec.tables):  # each table whole once, or its pieces adding up to it
        pieces = [s for s in shards if s.table == i]
        if result.plan[i] == {"type": "data_parallel"}:
            assert len(pieces) == 2 and all(p.shape == t.shape for p in pieces)
        else:
            assert (
                sum(p.shape.embedding_dim * p.shape.num_embeddings for p in pieces)
                == t.num_embeddings * t.embedding_dim
            )


def test_search_never_takes_a_move_that_breaks_the_memory_cap(model):
    """Replicating the small tables would be cheap to exchange but doubles their weights: with
    a cap just above the table-wise placement's per-rank weights, no replica fits."""
    from probes.vocabulary.table_shards import shard_bytes, table_shards

    spec = job([(60_000, 16, 20), (60_000, 16, 20)] + [(4000, 16, 1)] * 4)
    tw = choose_sharding(spec, model, memory_cap_bytes=float("inf"), search=False, torchrec=False)
    cap = max(max(c.detail["rank_memory_bytes"]) for c in tw.candidates if c.feasible) * 1.01
    decision = choose_sharding(spec, model, memory_cap_bytes=cap, torchrec=False)
    assert next(c for c in decision.candidates if c.name == "search").feasible
    for c in decision.candidates:
        if c.feasible:
            assert max(shard_bytes(table_shards(spec, c.detail["table_to_rank"]), 2)) <= cap


def test_local_search_is_deterministic_and_stops_at_its_budget(model):
    from policies.sharding import PlanPricer
    from policies.sharding_search import local_search

    rng = np.random.default_rng(4)
    spec = job([(int(rng.integers(1000, 90_000)), 16, int(rng.integers(1, 30))) for _ in range(10)])
    pricer = PlanPricer(spec, model, float("inf"))
    a = local_search(spec, [0] * 10, pricer.seconds, seed=3)
    b = local_search(spec, [0] * 10, pricer.seconds, seed=3)
    assert (a.plan, a.predicted_s, a.moves) == (b.plan, b.predicted_s, b.moves)
    assert a.predicted_s < a.start_s and not a.exhausted
    short = local_search(spec, [0] * 10, pricer.seconds, seed=3, max_evaluations=5)
    assert short.exhausted and short.evaluations == 5


def test_steps_whose_kernels_have_no_model_leave_the_overhead_unfitted():
    """A short sweep without lookups: the bundle still fits (its kernels), and says why it has
    no step overhead instead of failing the calibration."""
    from predictors.fit import fit_bundle
    from probes.vocabulary.ops import DLRM_STEP_OP

    spec = job([(1000, 16, 4)] * 4)
    step = Measurement(DLRM_STEP_OP, {"job": spec.to_dict(), "table_to_rank": [0, 1, 0, 1]}, 5e-3, 0.0, 20)
    bundle, _ = fit_bundle(gemm_rows(np.random.default_rng(0), 100) + [step] * 4, "synthetic")
    assert "dlrm" not in bundle.step_overheads and "gemm" in bundle.models
    assert bundle.meta["unfitted"][DLRM_STEP_OP].endswith("no model for embedding_fwd")

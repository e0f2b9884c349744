"""The MLflow side: registration, the champion rule, loading as data, no pickles."""

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest

from orchestrator import registry
from predictors import fit_performance_model
from probes.vocabulary.ops import gemm_params
from probes.vocabulary.records import Measurement

REPO = Path(__file__).resolve().parents[1]


def rows(noise: float, seed: int, bias: float = 1.0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(50):
        m, n, k = (int(x) for x in rng.integers(8, 1024, size=3))
        p = gemm_params(m, n, k)
        t = (3e-6 + p["flops"] / 3e10) * bias * (1 + noise * rng.standard_normal())
        out.append(Measurement("gemm", p, abs(t), 0.0, 5))
    return out


def register(model, test, hw):
    with mlflow.start_run():
        return registry.register_bundle(model, test, {"torch": "x"})


def test_first_is_champion_then_worse_is_challenger_then_better_wins(tracking):
    hw = "cpu-test"
    good, good_test = fit_performance_model(rows(0.02, 0), hw)
    first = register(good, good_test, hw)
    assert first.promoted and first.version == "1"

    # A challenger is judged by its own out-of-fold figures on its rows, the champion by
    # predicting those rows: one whose folds predicted badly does not take the title.
    bad, bad_test = fit_performance_model(rows(0.02, 1), hw)
    assert bad.metrics["gemm"]["judged"] == "5-fold"
    bad.metrics["gemm"] = {**bad.metrics["gemm"], "gmae": 0.5}
    second = register(bad, bad_test, hw)
    assert not second.promoted and "worse than champion v1" in second.reason
    assert registry.get_alias(hw, registry.CHAMPION).version == "1"
    assert registry.get_alias(hw, registry.CHALLENGER).version == "2"

    # The hardware slowed down: the champion mis-prices the new rows, a refit on them does not.
    better, better_test = fit_performance_model(rows(0.02, 3, bias=1.8), hw)
    third = register(better, better_test, hw)
    assert third.promoted
    champion = registry.get_alias(hw, registry.CHAMPION)
    assert champion.version == "3"
    assert champion.tags["hardware_id"] == hw and "heldout_gmae" in champion.tags


def test_a_challenger_is_judged_on_its_own_steps_by_their_left_out_figures(tracking):
    """Whole steps are fitted on all of a calibration's steps and judged each left out in turn
    (kernels each out of its fold): the champion comparison takes the challenger's own figures
    for them, never a re-prediction of rows it was fitted on (which would flatter it)."""
    from predictors.evaluation import ErrorStats
    from probes.vocabulary.ops import DLRM_STEP_OP

    hw = "cpu-steps"
    champion, test = fit_performance_model(rows(0.02, 0), hw)
    assert register(champion, test, hw).promoted
    challenger, challenger_test = fit_performance_model(rows(0.02, 0), hw)  # the same kernels
    challenger.metrics[DLRM_STEP_OP] = {"gmae": 0.30, "mape": 0.3, "std": 0.1, "n": 2, "judged": "leave-one-out"}
    steps = [Measurement(DLRM_STEP_OP, {"job": {}}, 0.01, 0.0, 5) for _ in range(2)]
    scored: list[tuple[object, list[str]]] = []

    def scorer(bundle, held_out):  # every bundle predicts these steps within 5% when asked
        scored.append((bundle, sorted({r.op for r in held_out})))
        scores = bundle.score(held_out)
        if any(r.op == DLRM_STEP_OP for r in held_out):
            scores[DLRM_STEP_OP] = ErrorStats(0.05, 0.05, 0.0, 2)
        return scores

    with mlflow.start_run():
        second = registry.register_bundle(challenger, challenger_test + steps, {"torch": "x"}, scorer=scorer)
    assert not second.promoted and "worse than champion v1" in second.reason
    assert [ops for bundle, ops in scored if bundle is challenger] == [[]]  # nothing it fitted re-predicted
    assert registry.left_out_scores(challenger) == {
        "gemm": challenger.metrics["gemm"],  # judged out of its fold
        DLRM_STEP_OP: challenger.metrics[DLRM_STEP_OP],
    }


def test_each_workloads_verdict_on_the_in_step_factors_reaches_the_run(tracking):
    """What the calibration printed (`predictors.step_fit.in_step_verdict`) is what MLflow keeps: the
    collectives' totals and each workload's steps with the factors and without, and whether it
    kept them."""
    from predictors.step_fit import STEP_WORKLOADS
    from probes.vocabulary.ops import IN_STEP_COLLECTIVE_OP

    model, _ = fit_performance_model(rows(0.02, 0), "cpu-verdict")
    model.metrics[IN_STEP_COLLECTIVE_OP] = {
        "kept": True,
        "dlrm": {
            **{"factors": {"all_to_all": 2.5}, "total_error": 0.08, "baseline_total_error": 0.12, "borne_out": True},
            **{"steps_gmae": 0.06, "baseline_steps_gmae": 0.09, "kept": True, "n": 40},
        },
        "transformer": {"factors": {"all_reduce": 1.4}, "total_error": 0.2, "baseline_total_error": 0.1, "n": 12},
    }
    with mlflow.start_run() as run:
        registration = registry.register_bundle(model, [], {"torch": "x"})  # verdicts are no op's error
    assert registration.promoted
    logged = mlflow.get_run(run.info.run_id).data.metrics
    prefix = f"heldout.{IN_STEP_COLLECTIVE_OP}"
    assert set(STEP_WORKLOADS.values()) == {"dlrm", "transformer"}
    assert {k: v for k, v in logged.items() if k.startswith(prefix)} == {
        f"{prefix}.dlrm.total_error": 0.08,
        f"{prefix}.dlrm.baseline_total_error": 0.12,
        f"{prefix}.dlrm.borne_out": 1.0,
        f"{prefix}.dlrm.steps_gmae": 0.06,
        f"{prefix}.dlrm.baseline_steps_gmae": 0.09,
        f"{prefix}.dlrm.kept": 1.0,
        f"{prefix}.dlrm.n_test": 40.0,
        # the transformer's collectives' totals refused them: its steps never judged them
        f"{prefix}.transformer.total_error": 0.2,
        f"{prefix}.transformer.baseline_total_error": 0.1,
        f"{prefix}.transformer.n_test": 12.0,
    }


def test_loading_in_a_fresh_process_reproduces_predictions_and_no_pickles(tracking, tmp_path):
    hw = "cpu-fresh"
    model, test = fit_performance_model(rows(0.05, 4), hw)
    register(model, test, hw)
    shapes = [gemm_params(64, 128, 256), gemm_params(1000, 10, 700)]
    expected = [model.predict("gemm", **p) for p in shapes]
    code = (
        "import json, sys; from orchestrator.registry import load_performance_model; "
        f"m = load_performance_model({tracking!r}, {hw!r}); "
        f"print(json.dumps([m.predict('gemm', **p) for p in {shapes!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected

    artifacts = list((tmp_path / "mlartifacts").rglob("*"))
    assert any(p.name == "performance_model.json" for p in artifacts)
    assert not [p for p in artifacts if p.suffix in (".pkl", ".pickle") or "pickle" in p.name]


def test_missing_champion_is_a_clear_lookup_error(tracking):
    with pytest.raises(LookupError, match="no model registered as perfmodel-nowhere@champion"):
        registry.load_performance_model(tracking, "nowhere")


def test_freshness_reasons(tracking):
    hw = "cpu-fresh2"
    model, test = fit_performance_model(rows(0.02, 5), hw)
    register(model, test, hw)
    champion = registry.get_alias(hw)
    assert registry.check_freshness(champion, {"torch": "x"}).fresh
    stale = registry.check_freshness(champion, {"torch": "y"})
    assert not stale.fresh and "torch x -> y" in stale.reasons[0]
    assert not registry.check_freshness(champion, {"torch": "x"}, max_age_days=-1).fresh
    assert registry.check_freshness(None, {}).reasons == ["no champion model for this hardware"]


def test_the_pyfunc_has_a_signature_and_prices_ops_as_the_bundle_does(tracking):
    import pandas as pd

    hw = "cpu-pyfunc"
    model, test = fit_performance_model(rows(0.02, 5), hw)
    register(model, test, hw)
    uri = f"models:/{registry.model_name(hw)}@{registry.CHAMPION}"
    info = mlflow.models.get_model_info(uri)
    assert [c["name"] for c in info.signature.inputs.to_dict()] == ["op", "params"]
    p = gemm_params(256, 512, 128)
    predicted = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"op": ["gemm"], "params": [json.dumps(p)]}))
    assert float(np.asarray(predicted).ravel()[0]) == pytest.approx(model.predict("gemm", **p))

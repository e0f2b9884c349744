"""The collective fit benchmark's second solver and its recording of the search's problems."""

import numpy as np
import pytest
from test_predictor_families import TRUE, curve_rows

import predictors.collective_model as collective_model
from benchmarks import collective_fit_solvers as solvers


def test_variable_projection_recovers_a_transition_it_is_started_away_from():
    xm = np.arange(10.5, 20.0, 0.5)
    truth = np.array([2.5, 15.0, 0.9, 6.5])
    ym = truth[0] * collective_model._logistic(xm, truth[1], truth[2]) + truth[3]
    start = np.array([1.0, 13.0, 2.0, 6.0])
    found, evaluations = solvers.variable_projection(xm, ym, 10.0, 20.0, start)
    assert found == pytest.approx(truth, rel=1e-5)
    assert solvers.rms(found, xm, ym) < 1e-6 and evaluations >= 1


def test_the_search_is_recorded_without_changing_what_it_fits():
    rows = curve_rows(TRUE, noise=0.03, seed=3)[::3]  # 18 sizes: a quick search
    solver = collective_model._fit_transition
    problems, seconds, curves = solvers.recorded_problems(rows)
    assert collective_model._fit_transition is solver and seconds > 0  # the solver is put back
    assert len(problems) > 10  # every breakpoint pair and fold with a transition to fit
    xm, ym, x1, x2, start, answer, _ = problems[0]
    assert np.array_equal(answer, collective_model._fit_transition(xm, ym, x1, x2, start))
    assert list(curves.values()) == [collective_model.SigmoidCollectiveModel("all_reduce").fit_curve(rows)]


def test_an_op_that_is_not_a_collective_exits_2_naming_the_allowed(capsys):
    with pytest.raises(SystemExit) as exited:
        solvers.main(["--ops", "gemm"])
    assert exited.value.code == 2
    assert "--ops: ['gemm'] are not collectives; allowed:" in capsys.readouterr().err

"""The plots logged with a calibration: collective curves over their points, held-out scatter."""

import mlflow
import numpy as np
from synthetic_rows import gemm_rows

from orchestrator import registry
from orchestrator.calibration_plots import log_calibration_plots
from predictors import fit_performance_model
from probes.vocabulary.ops import collective_params
from probes.vocabulary.records import Measurement


def test_plots_are_logged_as_png_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    registry.configure(f"sqlite:///{tmp_path}/mlflow.db")
    rng = np.random.default_rng(0)
    rows = gemm_rows(rng, 60)
    for world in (2, 4):
        for e in range(4, 24):
            t = 25e-6 * world + 2**e / 1e9 * (1 + 0.05 * rng.standard_normal())
            rows.append(Measurement("all_reduce", collective_params("all_reduce", 2**e, world), t, 0.0, 11))
    # two judge folds, not five (what is tested is that both plots are drawn and logged, not
    # the figures they show): every row is still judged out of its fold
    model, test_rows = fit_performance_model(rows, "cpu-test", folds=2)
    try:
        with mlflow.start_run() as run:
            logged = log_calibration_plots(model, rows, test_rows)
        assert logged == ["plots/collective_all_reduce.png", "plots/heldout_predicted_vs_measured.png"]
        client = mlflow.MlflowClient()
        for path in logged:
            local = client.download_artifacts(run.info.run_id, path, str(tmp_path))
            assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    finally:
        mlflow.set_tracking_uri(None)

"""MLflow "model from code" wrapper for a PerformanceModel bundle.

Logged by file path, so MLflow stores this source file and the JSON bundle, never a pickle.
Our own loader (`orchestrator.registry.load_performance_model`) reads the JSON directly and
runs no code at all; this wrapper only exists so `mlflow.pyfunc.load_model` also works for
people who want a DataFrame in, seconds out.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
from mlflow.pyfunc import PythonModel


class PerformanceModelPyfunc(PythonModel):
    def load_context(self, context) -> None:
        from predictors import PerformanceModel

        self.bundle = PerformanceModel.load_dir(Path(context.artifacts["performance_model"]).parent)

    def predict(self, context, model_input, params=None):
        """`model_input`: a DataFrame with columns `op` and `params` (a JSON object per row)."""
        return [
            self.bundle.predict(
                row["op"], **(json.loads(row["params"]) if isinstance(row["params"], str) else row["params"])
            )
            for row in model_input.to_dict(orient="records")
        ]


mlflow.models.set_model(PerformanceModelPyfunc())

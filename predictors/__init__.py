"""Performance models fitted to measurements, the estimators and the simulator that spend them."""

from predictors.fit import fit_bundle, fit_performance_model
from predictors.performance_model import OutOfRangeError, PerformanceModel

__all__ = ["PerformanceModel", "fit_bundle", "fit_performance_model", "OutOfRangeError"]

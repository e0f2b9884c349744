"""Performance models fitted to measurements, and (soon) the simulator that spends them."""
from predictors.performance_model import OutOfRangeError, PerformanceModel, fit_performance_model

__all__ = ["PerformanceModel", "fit_performance_model", "OutOfRangeError"]

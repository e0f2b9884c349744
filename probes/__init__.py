"""Microbenchmarks, reference workloads and the `Measurement` record.

Nothing here knows about Ray or MLflow: a probe is a plain function that runs real kernels
on the current device and returns `Measurement` rows. The orchestrator decides where it runs.
"""

from probes.vocabulary.records import Measurement, frame_to_measurements, measurements_to_frame

__all__ = ["Measurement", "measurements_to_frame", "frame_to_measurements"]

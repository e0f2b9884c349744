"""Append-only on-disk log of measurements and failures, written as each probe returns.

Whatever crashes later (a fit, MLflow, the driver), what was measured is already on disk.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from probes.collective import merge_passes
from probes.records import Measurement


class MeasurementStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.directory / "measurements.jsonl"
        self.failures_path = self.directory / "failures.jsonl"

    def add(self, rows: Iterable[Measurement]) -> int:
        n = 0
        with self.rows_path.open("a") as f:
            for r in rows:
                f.write(json.dumps(r.to_row()) + "\n")
                n += 1
            f.flush()
        return n

    def add_failure(self, spec: dict[str, Any], error: str, attempts: int) -> None:
        with self.failures_path.open("a") as f:
            f.write(json.dumps({"spec": spec, "error": error, "attempts": attempts}) + "\n")

    def rows(self) -> list[Measurement]:
        """Every measurement, a collective point measured over several sweep passes as one row."""
        if not self.rows_path.exists():
            return []
        return merge_passes([Measurement.from_row(json.loads(line)) for line in self.rows_path.read_text().splitlines()
                             if line])

    def failures(self) -> list[dict[str, Any]]:
        if not self.failures_path.exists():
            return []
        return [json.loads(line) for line in self.failures_path.read_text().splitlines() if line]

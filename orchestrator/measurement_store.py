"""Append-only on-disk log of measurements and failures, written as each probe returns.

Whatever crashes later (a fit, MLflow, the driver), what was measured is already on disk: every
append is flushed at once (a crashed process loses nothing it reported), and fsynced at batch
boundaries, at most `SYNC_EVERY_S` apart and whenever a phase ends (`sync`), so a lost machine
loses at most that much. A line torn by a crash mid-write (only the last can be) is skipped with
a warning when read back. `done.jsonl` lists every probe spec whose result is stored, so a
calibration cut short resumes with only what is missing (`calibrate --resume DIR`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

from probes.collective import merge_passes
from probes.vocabulary.records import Measurement

SYNC_EVERY_S = 0.5


def spec_key(spec: dict[str, Any]) -> str:
    """A probe spec's identity (family, params, key), stable across runs."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:20]


class MeasurementStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.directory / "measurements.jsonl"
        self.failures_path = self.directory / "failures.jsonl"
        self.done_path = self.directory / "done.jsonl"
        self._last_sync = 0.0
        self.torn_lines = 0

    def add(self, rows: Iterable[Measurement], done: dict[str, Any] | None = None) -> int:
        """Append `rows`, then mark `done` (the spec they answer) as stored."""
        lines = [json.dumps(r.to_row()) + "\n" for r in rows]
        self._append(self.rows_path, lines)
        if done is not None:
            self._append(self.done_path, [json.dumps({"key": spec_key(done)}) + "\n"])
        return len(lines)

    def mark_done(self, specs: Iterable[dict[str, Any]]) -> None:
        """Mark specs whose rows are stored (a collective batch's points after its first visit)."""
        self._append(self.done_path, [json.dumps({"key": spec_key(s)}) + "\n" for s in specs])

    def add_failure(self, spec: dict[str, Any], error: str, attempts: int) -> None:
        self._append(self.failures_path, [json.dumps({"spec": spec, "error": error, "attempts": attempts}) + "\n"])

    def _append(self, path: Path, lines: list[str]) -> None:
        if not lines:
            return
        with path.open("a") as f:
            f.writelines(lines)
            f.flush()
            if time.monotonic() - self._last_sync >= SYNC_EVERY_S:
                os.fsync(f.fileno())
                self._last_sync = time.monotonic()

    def sync(self) -> None:
        """fsync every file (a phase or the calibration ended)."""
        for path in (self.rows_path, self.failures_path, self.done_path):
            if path.exists():
                with path.open("a") as f:
                    os.fsync(f.fileno())
        self._last_sync = time.monotonic()

    def _read(self, path: Path) -> list[dict[str, Any]]:
        """Every whole JSON line; a torn one (a crash mid-write) is skipped with a warning."""
        if not path.exists():
            return []
        out = []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                self.torn_lines += 1
                warnings.warn(f"{path}: line {number} is not whole JSON (torn by a crash?); skipped", stacklevel=2)
        return out

    def rows(self) -> list[Measurement]:
        """Every measurement, a collective point measured over several sweep passes as one row."""
        rows = []
        for data in self._read(self.rows_path):
            try:
                rows.append(Measurement.from_row(data))
            except (KeyError, TypeError, ValueError):
                self.torn_lines += 1
                warnings.warn(f"{self.rows_path}: a row without the fields of a measurement; skipped", stacklevel=2)
        return merge_passes(rows)

    def failures(self) -> list[dict[str, Any]]:
        return self._read(self.failures_path)

    def done_keys(self) -> set[str]:
        return {d["key"] for d in self._read(self.done_path) if isinstance(d, dict) and "key" in d}

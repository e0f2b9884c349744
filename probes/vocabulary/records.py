"""The `Measurement` record: one timed point of one op on one device (or one group)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np


@dataclass
class Measurement:
    """A median time of repeated runs of one op with fixed parameters.

    `params` holds the op's features exactly as the predictors consume them, so a row can be
    fitted without knowing how it was produced. Times are seconds.
    """

    op: str
    params: dict[str, Any]
    median_s: float
    spread_s: float  # inter-quartile range of the repeats
    repeats: int
    device: str = "cpu"
    world_size: int = 1
    hardware_id: str = ""
    node: str = ""
    family: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["params"] = json.dumps(self.params, sort_keys=True)
        row["extra"] = json.dumps(self.extra, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Measurement":
        data = dict(row)
        for key in ("params", "extra"):
            if isinstance(data.get(key), str):
                data[key] = json.loads(data[key])
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: _plain(v) for k, v in data.items() if k in known})


def _plain(value: Any) -> Any:
    """numpy scalars from a DataFrame back to Python scalars."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def measurements_to_frame(rows: Iterable[Measurement]):
    """A pandas DataFrame with one row per measurement (params as a JSON string column)."""
    import pandas as pd

    return pd.DataFrame([m.to_row() for m in rows])


def frame_to_measurements(frame) -> list[Measurement]:
    return [Measurement.from_row(r) for r in frame.to_dict(orient="records")]

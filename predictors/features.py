"""Named feature functions of an op's params.

Models store feature *names*, never code, so a model loaded from a shared registry can only
call functions defined here.
"""
from __future__ import annotations

from typing import Any, Callable

Params = dict[str, Any]

FEATURES: dict[str, Callable[[Params], float]] = {
    "one": lambda p: 1.0,
    # GEMM
    "flops": lambda p: float(p["flops"]),
    "bytes": lambda p: float(p["bytes"]),
    "mn": lambda p: float(p["M"]) * float(p["N"]),
    # Embedding lookups (aggregated over a rank's tables)
    "tables": lambda p: float(p["T"]),
    "lookups": lambda p: float(p["lookups"]),
    "gathered_elems": lambda p: float(p["gathered_elems"]),
    "output_elems": lambda p: float(p["output_elems"]),
    "distinct_elems": lambda p: float(p["distinct_elems"]),
    "bags": lambda p: float(p["B"]) * float(p["T"]),
    # Per-iteration framework overhead of a training step
    "dense_layers": lambda p: float(p["dense_layers"]),
    "tables_total": lambda p: float(p["tables_total"]),
}


def feature_vector(names: list[str], params: Params) -> list[float]:
    try:
        return [FEATURES[n](params) for n in names]
    except KeyError as exc:
        raise KeyError(f"params {sorted(params)} lack {exc} needed by features {names}") from None

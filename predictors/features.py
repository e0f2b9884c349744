"""Named feature functions of an op's params.

Models store feature *names*, never code, so a model loaded from a shared registry can only
call functions defined here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Params = dict[str, Any]

FEATURES: dict[str, Callable[[Params], float]] = {
    "one": lambda p: 1.0,
    # GEMM
    "flops": lambda p: float(p["flops"]),
    "bytes": lambda p: float(p["bytes"]),
    "mn": lambda p: float(p.get("batch", 1)) * float(p["M"]) * float(p["N"]),
    "batch": lambda p: float(p.get("batch", 1)),
    "M": lambda p: float(p["M"]),
    "N": lambda p: float(p["N"]),
    "K": lambda p: float(p["K"]),
    "arith_intensity": lambda p: float(p["flops"]) / max(float(p["bytes"]), 1.0),
    # Embedding lookups (aggregated over a rank's tables)
    "tables": lambda p: float(p["T"]),
    "lookups": lambda p: float(p["lookups"]),
    "gathered_elems": lambda p: float(p["gathered_elems"]),
    "output_elems": lambda p: float(p["output_elems"]),
    "distinct_elems": lambda p: float(p["distinct_elems"]),
    "bags": lambda p: float(p["B"]) * float(p["T"]),
    "B": lambda p: float(p["B"]),
    "D_sum": lambda p: float(p["D_sum"]),
    "E_sum": lambda p: float(p["E_sum"]),
    "L_mean": lambda p: float(p["L_mean"]),
    "table_elems": lambda p: float(p["table_elems"]),
    "lookups_log_table": lambda p: _lookups_log_table(p),
    # Element-wise / normalisation
    "rows": lambda p: float(p["rows"]),
    "cols": lambda p: float(p["cols"]),
    "numel": lambda p: float(p["numel"]),
    # Per-iteration framework overhead of a training step
    "dense_layers": lambda p: float(p["dense_layers"]),
    "tables_total": lambda p: float(p["tables_total"]),
    "split_pieces": lambda p: float(p.get("split_pieces", 0)),
    "pooled_elems": lambda p: float(p["pooled_elems"]),  # batch x summed embedding dims
    "layers": lambda p: float(p["layers"]),
    "ops": lambda p: float(p["ops"]),  # graph ops a step issues on its busiest rank
    "collectives": lambda p: float(p["collectives"]),  # of them, collectives
    # of those, the layout's own (TP, FSDP) and DDP's gradient all-reduces (a transformer's)
    "layout_collectives": lambda p: float(p["layout_collectives"]),
    "gradient_reduces": lambda p: float(p["gradient_reduces"]),
    # 1 for a layout with hooks or several passes (FSDP, pipeline, micro-batches, recompute)
    "layout_work": lambda p: float(p["layout_work"]),
    # of those, the module passes wrapped (FSDP units' hooks, recomputed blocks, extra micro-batches)
    "wrapped_passes": lambda p: float(p["wrapped_passes"]),
    # the step's predicted kernel time: in-step interference grows with the work it slows
    "kernels_s": lambda p: float(p["kernels_s"]),
    # the busiest rank's kernels by class: a step slows each class differently (kernel_classes)
    "gemm_s": lambda p: float(p["gemm_s"]),
    "memory_s": lambda p: float(p["memory_s"]),
    "collective_s": lambda p: float(p["collective_s"]),
    # of those, the layout's own (a transformer's: DDP's gradient all-reduces left out)
    "layout_collective_s": lambda p: float(p["layout_collective_s"]),
    # of the memory-bound time, what the node's other ranks run beside it (a shared memory system)
    "memory_alongside_s": lambda p: float(p["memory_alongside_s"]),
}


def _lookups_log_table(p: Params) -> float:
    """Lookups weighted by log2(1 + table MiB) (`tbe_features.lookups_log_table_mib`); for rows
    measured before it was recorded, from the set's mean table size (fp32)."""
    if "lookups_log_table_mib" in p:
        return float(p["lookups_log_table_mib"])
    mean_table_bytes = float(p["table_elems"]) * 4.0 / max(float(p["T"]), 1.0)
    return float(p["lookups"]) * float(np.log2(1.0 + mean_table_bytes / 2**20))


def feature_vector(names: list[str], params: Params) -> list[float]:
    try:
        return [FEATURES[n](params) for n in names]
    except KeyError as exc:
        raise KeyError(f"params {sorted(params)} lack {exc} needed by features {names}") from None


def design_row(names: list[str], params: Params) -> list[float]:
    """Model inputs from params: `log:<feature>` is log(1 + value); `hist:<key>` expands a list
    (the 17 reuse-factor bins); `is:<key>=<value>` is a one-hot indicator."""
    row: list[float] = []
    for name in names:
        kind, _, arg = name.partition(":")
        if kind == "log":
            row.append(float(np.log1p(max(FEATURES[arg](params), 0.0))))
        elif kind == "hist":
            row.extend(float(v) for v in params[arg])
        elif kind == "is":
            key, _, value = arg.partition("=")
            row.append(1.0 if str(params.get(key)) == value else 0.0)
        else:
            raise KeyError(f"unknown design feature {name!r}")
    return row

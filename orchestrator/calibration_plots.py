"""Plots logged with every calibration, so a person sees a bad fit at a glance: each collective's
fitted curves over the points they were fitted to, and per op predicted against measured time
on the held-out rows."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

import mlflow
import numpy as np

from predictors.collective_curves import group_key
from predictors.collective_model import SigmoidCollectiveModel
from predictors.performance_model import PerformanceModel
from probes.vocabulary.records import Measurement


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display on cluster nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def collective_curves(model: PerformanceModel, rows: Sequence[Measurement]) -> dict[str, Any]:
    """One figure per collective op (by file name): measured points and the fitted curve, one
    colour per group."""
    plt = pyplot()
    figures = {}
    for op, op_model in sorted(model.models.items()):
        if not isinstance(op_model, SigmoidCollectiveModel) or not op_model.curves:
            continue
        points: dict[str, list[Measurement]] = defaultdict(list)
        for r in rows:
            if r.op == op:
                points[group_key(r.params)].append(r)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (key, curve) in enumerate(sorted(op_model.curves.items())):
            colour = f"C{i % 10}"
            measured = points.get(key, [])
            if measured:
                ax.scatter(
                    [r.params["bytes"] for r in measured],
                    [r.median_s * 1e3 for r in measured],
                    s=10,
                    color=colour,
                    alpha=0.6,
                )
            x = np.linspace(curve.x_min, curve.x_max, 200)
            ax.plot(2**x, curve.predict_log2(x) * 1e3, color=colour, label=f"group {key} ({len(measured)} points)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"{op}: fitted curves over measured points", fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figures[f"collective_{op}.png"] = fig
    return figures


def heldout_scatter(model: PerformanceModel, test_rows: Sequence[Measurement]) -> Any:
    """Predicted vs measured on the held-out rows, one panel per op, with the y = x line: each
    op's rows as its fit judged them out of their fold (`model.out_of_fold`), else (a bundle
    loaded back, which keeps no such record) `test_rows` priced by the model."""
    by_op: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for op, pairs in model.out_of_fold.items():
        if pairs:
            by_op[op] = list(pairs)
    for r in test_rows:
        if r.op in model.models and r.op not in model.out_of_fold:
            try:
                by_op[r.op].append((r.median_s, model.predict_params(r.op, r.params)))
            except KeyError:
                continue
    if not by_op:
        return None
    plt = pyplot()
    cols = min(4, len(by_op))
    rows_n = math.ceil(len(by_op) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.2 * cols, 3.0 * rows_n), squeeze=False)
    for ax, (op, pairs) in zip(axes.flat, sorted(by_op.items())):
        measured, predicted = (np.array(v) * 1e3 for v in zip(*pairs))
        ax.scatter(measured, predicted, s=8, alpha=0.6)
        lo, hi = min(measured.min(), predicted.min()), max(measured.max(), predicted.max())
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        gmae = model.metrics.get(op, {}).get("gmae")
        ax.set_title(f"{op} (n={len(pairs)}" + (f", GMAE {gmae:.1%})" if gmae is not None else ")"), fontsize=8)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
    for ax in list(axes.flat)[len(by_op) :]:
        ax.axis("off")
    fig.supxlabel("measured (ms)")
    fig.supylabel("predicted (ms)")
    fig.tight_layout()
    return fig


def log_calibration_plots(
    model: PerformanceModel, rows: Sequence[Measurement], test_rows: Sequence[Measurement]
) -> list[str]:
    """Draw both kinds of plot and log them to the active run under plots/ (`mlflow.log_figure`)."""
    figures = collective_curves(model, rows)
    scatter = heldout_scatter(model, test_rows)
    if scatter is not None:
        figures["heldout_predicted_vs_measured.png"] = scatter
    plt = pyplot()
    for name, fig in figures.items():
        mlflow.log_figure(fig, f"plots/{name}")
        plt.close(fig)
    return [f"plots/{name}" for name in figures]

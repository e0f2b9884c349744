"""Where the transformer step overhead leans, by layout, on the steps it was fitted on.

    .venv/bin/python benchmarks/transformer_step_lean.py [ROWS ...] [--last N] [--models DIR] [--out F]

ROWS: stored #26 cycles' `measurements_HHMM.jsonl.gz` (default: the last `--last` stored cycles
that have a DLRM run beside them, as `overhead_feature_refit` picks them). Each cycle's bundle
below the steps (`overhead_feature_refit.below_steps`, kept in `--models DIR`) takes its step
stage (`fit.fit_step_stage`, this code), and each transformer step the calibration measured is
priced by it: its signed error (price / measured - 1), grouped by the layout family the step
trained under (`layout_family`) and whether it was a small stack or a task-shaped one.

One overhead is fitted over every layout (`transformer_estimator.OVERHEAD_FEATURES`: per step,
per op, per collective and per kernel class). Where it fits one family's steps high and
another's low on the very steps it saw, the e2e benchmark's data-parallel tasks inherit the
first lean: a paired figure for a candidate feature or a per-layout fit to move. Group means are
averaged per cycle first and the interval is over cycles (a cycle's steps share its host's
spell and its fit).

Writes benchmarks/results/transformer_step_lean.json.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.overhead_feature_refit import add_cycle_arguments, below_steps, chosen_cycles, each_cycle, shown_path  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.evaluation import mean_interval  # noqa: E402
from predictors.fit import fit_step_stage  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.transformer_estimator import estimate_transformer_iteration  # noqa: E402
from probes.training import small_transformer_probe  # noqa: E402
from probes.vocabulary.ops import TRANSFORMER_STEP_OP  # noqa: E402
from probes.vocabulary.placement import placement_of  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402


def layout_family(spec: TransformerSpec) -> str:
    """The layout a step trained under, by the framework work it adds: tensor parallel, FSDP,
    pipeline, micro-batched or recomputed, else plain data parallel."""
    if spec.tensor_parallel > 1:
        return "tensor parallel"
    if spec.fsdp != "none":
        return "fsdp"
    if spec.pipeline_parallel > 1:
        return "pipeline"
    if spec.micro_batches > 1 or spec.recompute:
        return "micro-batched"
    return "data parallel"


def step_group(row: Measurement) -> str:
    """A transformer step's group: its layout family, its dtype, small stack or task-shaped."""
    spec = TransformerSpec.from_dict(row.params["transformer"])
    index = int(spec.name.removeprefix("probe"))
    size = "small" if small_transformer_probe(index, spec.world_size) else "task"
    return f"{layout_family(spec)} {spec.dtype} {size}"


def signed_by_group(rows: list[Measurement], below: PerformanceModel) -> dict[str, list[float]]:
    """Each transformer step's signed error under the step stage fitted on `rows` over `below`."""
    model = copy.deepcopy(below)
    fit_step_stage(model, rows, seed=0)
    return signed_errors(model, rows, step_group)


def signed_errors(
    model: PerformanceModel, rows: list[Measurement], group: Callable[[Measurement], str]
) -> dict[str, list[float]]:
    """Each transformer step of `rows` priced by `model`: its signed error, under its `group`."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row.op != TRANSFORMER_STEP_OP:
            continue
        spec = TransformerSpec.from_dict(row.params["transformer"])
        priced = estimate_transformer_iteration(spec, model, placement=placement_of(row.params, spec.world_size))
        groups.setdefault(group(row), []).append(priced.iteration_s / row.median_s - 1.0)
    return groups


def lean_of_cycle(rows_path: Path, models: Path | None) -> dict:
    rows = read_rows(rows_path)
    groups = signed_by_group(rows, below_steps(rows, rows_path, models))
    return {
        "rows": shown_path(rows_path),
        "groups": {g: {"steps": len(v), "mean_signed": float(np.mean(v))} for g, v in sorted(groups.items())},
    }


def summary_of(cycles: list[dict]) -> dict[str, dict]:
    """Per group: the mean over cycles of each cycle's mean signed error, its 95% interval over
    cycles (None under two), the cycles and the steps behind it."""
    out: dict[str, dict] = {}
    for group in sorted({g for c in cycles for g in c["groups"]}):
        means = np.array([c["groups"][group]["mean_signed"] for c in cycles if group in c["groups"]])
        out[group] = {
            "mean_signed": float(means.mean()),
            "interval": list(mean_interval(means)) if len(means) >= 2 else None,
            "cycles": len(means),
            "steps": sum(c["groups"][group]["steps"] for c in cycles if group in c["groups"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser)
    args = parser.parse_args()
    cycles = []
    for cycle in each_cycle(chosen_cycles(args), lambda path: lean_of_cycle(path, args.models)):
        cycles.append(cycle)
        print("  " + ", ".join(f"{g} {v['mean_signed']:+.1%} (n={v['steps']})" for g, v in cycle["groups"].items()))
    summary = summary_of(cycles)
    print(f"over {len(cycles)} cycles, the step stage's signed error on its own transformer steps:")
    for group, figures in summary.items():
        interval = figures["interval"]
        shown = f" [{interval[0]:+.1%}, {interval[1]:+.1%}]" if interval else ""
        print(
            f"  {group:<34} {figures['mean_signed']:+6.1%}{shown} ({figures['cycles']} cycles, {figures['steps']} steps)"
        )
    named = " ".join(map(str, args.rows)) if args.rows else f"--last {args.last}"
    out = args.out or str(REPO / "benchmarks/results/transformer_step_lean.json")
    command = f"python benchmarks/transformer_step_lean.py {named}"
    print(f"wrote {write_result(out, {'command': command, 'summary': summary, 'cycles': cycles})}")


if __name__ == "__main__":
    main()

"""The transformer step overhead on other feature sets, judged on stored #26 cycles side by side.

    .venv/bin/python benchmarks/transformer_overhead_refit.py [ROWS ...] [--last N] [--models DIR] [--out F]
        [--variants NAME,...] [--against JSON]

ROWS: a stored cycle's `measurements_HHMM.jsonl.gz` with its `transformer_HHMM.json` beside it
(default: the last `--last` stored cycles that have both). Each cycle's bundle is fitted from its
rows once below the steps (`overhead_feature_refit.below_steps`, kept in `--models DIR`), then its
step stage once per variant (`VARIANTS`: the overhead's features, and whether the transformer's
in-step collective factors may be kept) on those same kernel models. Each variant prices:

- the cycle's own transformer steps, each left out in turn (GMAE), and its signed error on them
  by layout family (`transformer_step_lean.layout_family`): one overhead over every layout fits
  plain data parallel high and the layouts with hooks or several passes low, and a plan that
  chooses between layouts inherits that;
- the cycle's measured data-parallel and tensor-parallel tasks (`refit_e2e.transformer_predictions`):
  geomean, worst and mean signed error, and whether #26's bars are met;
- the calibration's own steps as the run's step checks re-timed them (`own_steps_signed`), and
  the transfer: the DP run's mean signed error less that (how the fit carries from its own steps
  to jobs it never saw, the host's drift taken out; its sd over the cycles in the summary).

The tasks' times are one spell's and only the overhead differs, so each variant against the
default is a paired comparison; over the cycles, the mean paired change with its 95% interval.
Variants are named before they are judged, so the figures are not a search over feature sets
(`--variants`: only those named, the default always among them). `--against`: this benchmark's
JSON written by other code (another graph, say) on the same cycles and bundles; the default's
change from it, cycle by cycle (`against`), is how a change below the overhead is judged.

Writes benchmarks/results/transformer_overhead_refit.json (or `--out`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.issue26_tally import RUN_FIGURES, run_meets_bars  # noqa: E402
from benchmarks.overhead_feature_refit import (  # noqa: E402
    add_cycle_arguments,
    below_steps,
    change_text,
    chosen_cycles,
    cycle_key,
    each_cycle,
    paired_change,
    shown_path,
)
from benchmarks.overhead_feature_refit import run_of as shared_run_of  # noqa: E402
from benchmarks.overhead_feature_refit import stored_cycles as shared_stored_cycles  # noqa: E402
from benchmarks.refit_e2e import read_rows, run_summary, transformer_predictions  # noqa: E402
from benchmarks.step_checks import OWN_STEPS  # noqa: E402
from benchmarks.step_checks import summary as check_summary  # noqa: E402
from benchmarks.transformer_step_lean import layout_family, signed_errors  # noqa: E402
from predictors.evaluation import mean_change  # noqa: E402
from predictors.fit import fit_step_stage  # noqa: E402
from predictors.kernel_classes import one_slowdown  # noqa: E402
from predictors.performance_model import PerformanceModel  # noqa: E402
from predictors.step_fit import IN_STEP_WORKLOADS  # noqa: E402
from predictors.transformer_estimator import OVERHEAD_FEATURES  # noqa: E402
from probes.vocabulary.ops import TRANSFORMER_STEP_OP  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402
from probes.vocabulary.transformer_spec import TransformerSpec  # noqa: E402

WORKLOAD = "transformer"
DEFAULT = "default"


@dataclass(frozen=True)
class Variant:
    """One way of fitting the transformer's step stage: its overhead's features, and whether its
    in-step collective factors may be kept (`step_fit.fit_steps`' `in_step_workloads`)."""

    features: list[str]
    in_step: bool = True

    def in_step_workloads(self) -> tuple[str, ...]:
        return tuple(w for w in IN_STEP_WORKLOADS if self.in_step or w != WORKLOAD)


VARIANTS: dict[str, Variant] = {
    DEFAULT: Variant(list(OVERHEAD_FEATURES)),
    "one slowdown": Variant(one_slowdown(OVERHEAD_FEATURES)),  # fewer coefficients on 16 noisy steps
    "default + layout_work": Variant([*OVERHEAD_FEATURES, "layout_work"]),
    "one slowdown + layout_work": Variant([*one_slowdown(OVERHEAD_FEATURES), "layout_work"]),
    "default + wrapped_passes": Variant([*OVERHEAD_FEATURES, "wrapped_passes"]),
    # `collectives` split into the layout's own and DDP's gradient all-reduces, each its own cost
    "collectives split": Variant(
        [*(f for f in OVERHEAD_FEATURES if f != "collectives"), "layout_collectives", "gradient_reduces"]
    ),
    # the layout's own collectives counted, DDP's left to the collective kernels' slowdown
    "layout collectives": Variant([f if f != "collectives" else "layout_collectives" for f in OVERHEAD_FEATURES]),
    # the kernels' collective slowdown on the layout's own collectives only, DDP's at their simulated time
    "layout collective_s": Variant([f if f != "collective_s" else "layout_collective_s" for f in OVERHEAD_FEATURES]),
    # the steps' collectives at the isolated curves always: a keep decided on 16 steps left out in
    # turn moves every task's collectives at once (#26, 12-07: the transfer's sd 0.100 where kept)
    "in-step factors never kept": Variant(list(OVERHEAD_FEATURES), in_step=False),
}


# the cycles and runs of `overhead_feature_refit`, with the transformer's run beside the rows
run_of = partial(shared_run_of, workload=WORKLOAD)
stored_cycles = partial(shared_stored_cycles, workload=WORKLOAD)


def lean_by_layout(model: PerformanceModel, rows: list[Measurement]) -> dict[str, dict]:
    """The signed error of `model` on the transformer steps it was fitted on, by layout family."""
    groups = signed_errors(model, rows, lambda row: layout_family(TransformerSpec.from_dict(row.params["transformer"])))
    return {g: {"steps": len(v), "mean_signed": float(np.mean(v))} for g, v in sorted(groups.items())}


def run_figures(tasks: list[dict]) -> dict:
    summary = run_summary(tasks)
    figures = {k: summary[k] for k in (*RUN_FIGURES, "tasks")}
    return {**figures, "met": run_meets_bars(summary)}


def own_steps_signed(model: PerformanceModel, rows: list[Measurement], run: dict) -> float | None:
    """`model`'s signed error on the calibration's own steps as the run's step checks re-timed
    them (`step_checks.StepChecks.result`'s `own_steps_signed`, repriced): the median over the
    checks that returned of `step_checks.summary`'s mean over their steps. None when the run
    has no such check."""
    kind = OWN_STEPS[WORKLOAD]
    by_name = {kind.name(r): r for r in rows if r.op == kind.op and kind.like_tasks(r)}
    prices: dict[str, float] = {}

    def repriced(step: dict) -> dict:
        if step["name"] not in prices:
            prices[step["name"]] = kind.price_s(model, by_name[step["name"]]) * 1e3
        return {**step, "predicted_ms": prices[step["name"]]}

    checks = [c for c in run.get("step_checks") or [] if "error" not in c]
    signed = [check_summary([repriced(step) for step in c["steps"]])["signed_now"] for c in checks]
    return statistics.median(signed) if signed else None


def judge_variant(below: PerformanceModel, rows: list[Measurement], run: dict, variant: Variant, seed: int = 0) -> dict:
    """The step stage fitted as `variant` says, and what it prices. `transfer`: the DP runs'
    mean signed error less the model's on its own steps re-timed beside them (`own_steps_signed`)."""
    model = copy.deepcopy(below)
    fit_step_stage(
        model,
        rows,
        seed=seed,
        overhead_features={WORKLOAD: variant.features},
        in_step_workloads=variant.in_step_workloads(),
    )
    overhead = model.step_overheads.get(WORKLOAD)
    steps = model.metrics.get(TRANSFORMER_STEP_OP) or {}
    data_parallel = run_figures(transformer_predictions(model, run["tasks"]))
    own = own_steps_signed(model, rows, run)
    judged = {
        "steps_left_out_gmae": steps.get("gmae"),
        "steps": steps.get("n"),
        "coefficients": None if overhead is None else dict(zip(overhead.features, map(float, overhead.coef))),
        "in_step_kept": model.in_step is not None and WORKLOAD in model.in_step.by_workload,
        "lean_by_layout": lean_by_layout(model, rows),
        "data_parallel": data_parallel,
        "own_steps_signed": own,
        "transfer": None if own is None else data_parallel["mean_signed_error"] - own,
    }
    if run.get("tensor_parallel_tasks"):
        judged["tensor_parallel"] = run_figures(transformer_predictions(model, run["tensor_parallel_tasks"]))
    return judged


def judge_cycle(rows_path: Path, models: Path | None, labels: list[str], seeds: list[int]) -> list[dict]:
    """The cycle's step stage fitted as each variant says at each of `seeds` (the held-out split
    of the in-step factors' collectives: a keep can turn on it), on one below-steps bundle."""
    rows = read_rows(rows_path)
    run = json.loads(run_of(rows_path).read_text())
    below = below_steps(rows, rows_path, models)
    return [
        {
            "rows": shown_path(rows_path),
            "task_seed": run.get("task_seed"),
            "seed": seed,
            "variants": {label: judge_variant(below, rows, run, VARIANTS[label], seed) for label in labels},
        }
        for seed in seeds
    ]


def paired(cycles: list[dict], label: str, figure: str, kind: str = "data_parallel") -> dict | None:
    """The mean change of `figure` from the default to `label` over the cycles, with its interval."""
    return paired_by(cycles, label, lambda judged: judged[kind][figure] if kind in judged else None)


def paired_by(cycles: list[dict], label: str, of: Callable[[dict], float | None]) -> dict | None:
    """The mean change of `of` (a judged variant's figure; None where it has none) from the
    default to `label` over the cycles where both have it, with its interval. A cycle judged at
    several seeds counts once, at its mean change over them: its run was measured once."""

    def change(cycle: dict) -> float | None:
        a, b = of(cycle["variants"][DEFAULT]), of(cycle["variants"][label])
        return None if a is None or b is None else b - a

    return mean_change(per_run(cycles, change))


def run_key(cycle: dict) -> str:
    """Which measured run a judged fit belongs to: its rows' file (a fit per seed shares it)."""
    return cycle.get("rows") or str(id(cycle))


def per_run(cycles: list[dict], of: Callable[[dict], float | None]) -> list[float]:
    """`of` of each fit, averaged over each run's fits (`run_key`), the fits without it left out."""
    by_run: dict[str, list[float]] = {}
    for cycle in cycles:
        value = of(cycle)
        if value is not None:
            by_run.setdefault(run_key(cycle), []).append(value)
    return [float(np.mean(values)) for values in by_run.values()]


def against(cycles: list[dict], before: dict) -> dict:
    """The default's change from `before` (this benchmark's JSON from other code, e.g. another
    graph) on the cycles both judged, matched by their rows' file: a paired comparison of two
    code versions on the same stored kernel rows and runs."""

    def key(cycle: dict) -> tuple[str, int]:  # an output from before `--seeds` fitted at seed 0
        return cycle_key(cycle), cycle.get("seed", 0)

    earlier = {key(c): c["variants"][DEFAULT] for c in before["cycles"]}
    pairs = [(earlier[key(c)], c["variants"][DEFAULT]) for c in cycles if key(c) in earlier]

    change = partial(paired_change, pairs)

    def dp(figure: str) -> Callable[[dict], float]:
        return lambda judged: judged["data_parallel"][figure]

    def tp(judged: dict) -> float | None:
        return judged["tensor_parallel"]["geomean_error"] if "tensor_parallel" in judged else None

    return {
        "command": before.get("command"),
        **{figure: change(dp(figure)) for figure in RUN_FIGURES},
        "abs_mean_signed_error": change(lambda j: abs(j["data_parallel"]["mean_signed_error"])),
        "tp_geomean_error": change(tp),
        "steps_left_out_gmae": change(lambda j: j["steps_left_out_gmae"]),
        "bars_met": [
            sum(a["data_parallel"]["met"] for a, _ in pairs),
            sum(b["data_parallel"]["met"] for _, b in pairs),
        ],
    }


def summarize(cycles: list[dict]) -> dict[str, dict]:
    """Per variant over the cycles: steps left out (mean GMAE), the DP runs' mean signed (and its
    sd), mean |signed|, mean geomean and worst, bars met, TP runs' mean geomean, the lean by
    layout (mean over cycles), and each run figure's paired change from the default."""
    out: dict[str, dict] = {}
    for label in cycles[0]["variants"] if cycles else []:
        judged = [c["variants"][label] for c in cycles]
        dp = [j["data_parallel"] for j in judged]
        signed = np.array([r["mean_signed_error"] for r in dp])
        tp = [j["tensor_parallel"]["geomean_error"] for j in judged if "tensor_parallel" in j]
        families = sorted({f for j in judged for f in j["lean_by_layout"]})
        out[label] = {
            "steps_left_out_gmae": float(np.mean([j["steps_left_out_gmae"] for j in judged])),
            "dp_mean_signed": float(signed.mean()),
            "dp_signed_sd": float(signed.std(ddof=1)) if len(signed) > 1 else None,
            "dp_mean_abs_signed": float(np.abs(signed).mean()),
            "dp_mean_geomean": float(np.mean([r["geomean_error"] for r in dp])),
            "dp_mean_max": float(np.mean([r["max_error"] for r in dp])),
            "dp_bars_met": sum(r["met"] for r in dp),
            "tp_mean_geomean": float(np.mean(tp)) if tp else None,
            "lean_by_layout": {
                f: float(np.mean([j["lean_by_layout"][f]["mean_signed"] for j in judged if f in j["lean_by_layout"]]))
                for f in families
            },
            "fits": len(cycles),
            "cycles": len({run_key(c) for c in cycles}),
            "in_step_kept": sum(bool(j.get("in_step_kept")) for j in judged),
            **transfer_spread(cycles, label),
        }
        if label == DEFAULT:
            out[label]["by_seed"] = seed_turns(cycles)
            continue
        out[label]["paired"] = paired_figures(cycles, label)
        if not VARIANTS[label].in_step:  # it can move a fit only where the default kept the factors
            kept = [c for c in cycles if c["variants"][DEFAULT].get("in_step_kept")]
            out[label]["where_default_kept"] = {
                "fits": len(kept),
                "cycles": len({run_key(c) for c in kept}),
                "paired": paired_figures(kept, label),
                "transfer": {name: transfer_spread(kept, name) for name in (DEFAULT, label)},
            }
    return out


def seed_turns(cycles: list[dict]) -> dict:
    """How the default's in-step keep and its DP mean signed error move with the step fit's seed
    alone, over the runs fitted at several seeds: the runs kept at some seed, at every seed, and
    those whose keep turns on it, and the run whose mean signed error the seed moves most."""
    by_run: dict[str, list[dict]] = {}
    for cycle in cycles:
        by_run.setdefault(run_key(cycle), []).append(cycle["variants"][DEFAULT])
    several = {run: fits for run, fits in by_run.items() if len(fits) > 1}
    kept = {run: [bool(f.get("in_step_kept")) for f in fits] for run, fits in several.items()}
    signed = {run: [f["data_parallel"]["mean_signed_error"] for f in fits] for run, fits in several.items()}
    widest = max(signed, key=lambda run: max(signed[run]) - min(signed[run]), default=None)
    return {
        "runs": len(several),
        "kept_at_some_seed": sum(any(k) for k in kept.values()),
        "kept_at_every_seed": sum(all(k) for k in kept.values()),
        "turning_on_seed": sum(any(k) and not all(k) for k in kept.values()),
        "widest_signed_range": None
        if widest is None
        else {"rows": widest, "low": min(signed[widest]), "high": max(signed[widest])},
    }


def paired_figures(cycles: list[dict], label: str) -> dict:
    """Each figure's paired change from the default to `label` over `cycles` (`paired_by`)."""
    return {
        **{figure: paired(cycles, label, figure) for figure in RUN_FIGURES},
        "abs_mean_signed_error": paired_by(cycles, label, lambda j: abs(j["data_parallel"]["mean_signed_error"])),
        "tp_geomean_error": paired(cycles, label, "geomean_error", "tensor_parallel"),
        "steps_left_out_gmae": paired_by(cycles, label, lambda j: j["steps_left_out_gmae"]),
    }


def transfer_spread(cycles: list[dict], label: str) -> dict:
    """`label`'s transfer over the cycles' runs that have it (a step check returned): its sd and
    mean over the runs, a run judged at several seeds at its mean over them."""
    values = per_run(cycles, lambda cycle: cycle["variants"][label].get("transfer"))
    return {
        "transfer_runs": len(values),
        "transfer_mean": float(np.mean(values)) if values else None,
        "transfer_sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
    }


def seed_list(text: str) -> list[int]:
    """`--seeds`: comma-separated non-negative integers."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated non-negative integers, e.g. 0,1,2")
    return seeds


def print_cycle(cycle: dict) -> None:
    print(f"  fit seed {cycle['seed']}:", flush=True)
    for label, judged in cycle["variants"].items():
        dp, tp = judged["data_parallel"], judged.get("tensor_parallel")
        lean = ", ".join(f"{f} {v['mean_signed']:+.1%}" for f, v in judged["lean_by_layout"].items())
        print(
            f"  {label:27s} steps left out {judged['steps_left_out_gmae']:.1%}; DP {dp['geomean_error']:.1%} / "
            f"max {dp['max_error']:.1%} / signed {dp['mean_signed_error']:+.1%} ({'met' if dp['met'] else 'missed'})"
            + (f"; TP {tp['geomean_error']:.1%}" if tp else "")
            + (f"; transfer {judged['transfer']:+.1%}" if judged.get("transfer") is not None else "")
            + f"; in-step factors {'kept' if judged.get('in_step_kept') else 'not kept'}"
            + f"\n      own steps by layout: {lean}",
            flush=True,
        )


def print_summary(summary: dict[str, dict]) -> None:
    for label, s in summary.items():
        print(
            f"{label:27s} steps left out {s['steps_left_out_gmae']:.1%}; DP signed {s['dp_mean_signed']:+.1%} "
            f"(sd {s['dp_signed_sd'] or 0:.1%}, mean |signed| {s['dp_mean_abs_signed']:.1%}), geomean "
            f"{s['dp_mean_geomean']:.1%}, max {s['dp_mean_max']:.1%}, bars met {s['dp_bars_met']} of {s['fits']} fits"
            + (f"; TP geomean {s['tp_mean_geomean']:.1%}" if s["tp_mean_geomean"] is not None else "")
            + f"; in-step factors kept in {s['in_step_kept']}"
            + (
                f"; transfer sd {s['transfer_sd']:.3f} over {s['transfer_runs']} runs (mean {s['transfer_mean']:+.1%})"
                if s["transfer_sd"] is not None
                else ""
            )
        )
        print("      own steps by layout: " + ", ".join(f"{f} {v:+.1%}" for f, v in s["lean_by_layout"].items()))
        turns = s.get("by_seed")
        if turns and turns["runs"]:
            wide = turns["widest_signed_range"]
            print(
                f"      over {turns['runs']} runs fitted at several seeds: in-step factors kept at some seed in "
                f"{turns['kept_at_some_seed']}, at every seed in {turns['kept_at_every_seed']}, turning on the seed in "
                f"{turns['turning_on_seed']}; the DP mean signed moved most by the seed in {wide['rows']}: "
                f"{wide['low']:+.1%} to {wide['high']:+.1%}"
            )
        for figure, change in s.get("paired", {}).items():
            if change is not None:
                print(f"      {figure} - default: {change_text(change)}")
        kept = s.get("where_default_kept")
        if kept:
            print(f"    where the default kept its in-step factors ({kept['fits']} fits of {kept['cycles']} cycles):")
            for figure, change in kept["paired"].items():
                if change is not None:
                    print(f"      {figure} - default: {change_text(change)} over {change['cycles']} cycles")
            for name, t in kept["transfer"].items():
                if t["transfer_sd"] is not None:
                    print(f"      transfer, {name}: sd {t['transfer_sd']:.3f} over {t['transfer_runs']} runs")


def print_against(changes: dict, before: Path) -> None:
    print(f"default against {before} (this code - that):")
    for figure, change in changes.items():
        if isinstance(change, dict):
            print(f"      {figure}: {change_text(change)} over {change['cycles']} cycles")
    print(f"      bars met: {changes['bars_met'][0]} -> {changes['bars_met'][1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cycle_arguments(parser, last=8)
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=list(VARIANTS),
        help=f"comma-separated, of: {', '.join(VARIANTS)} (default every one; the default always runs: the others are paired with it)",
    )
    parser.add_argument(
        "--against", type=Path, help="this benchmark's JSON from other code: the default's paired change from it"
    )
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=[0],
        help="comma-separated step-stage fit seeds, each cycle fitted at each (default 0)",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: {', '.join(unknown)} not among {', '.join(VARIANTS)}")
    labels = [DEFAULT, *(label for label in VARIANTS if label in args.variants and label != DEFAULT)]
    paths = chosen_cycles(args, WORKLOAD)
    cycles = []
    for judged in each_cycle(paths, lambda path: judge_cycle(path, args.models, labels, args.seeds)):
        for cycle in judged:
            cycles.append(cycle)
            print_cycle(cycle)
    summary = summarize(cycles)
    print(f"over {len(paths)} cycles, {len(cycles)} fits:")
    print_summary(summary)
    named = " ".join(shown_path(p) for p in paths) if args.rows else f"--last {args.last}"
    command = f"python benchmarks/transformer_overhead_refit.py {named}"
    out = args.out or str(REPO / "benchmarks/results/transformer_overhead_refit.json")
    if labels != list(VARIANTS):
        command += f" --variants '{','.join(labels)}'"
    if args.seeds != [0]:
        command += f" --seeds {','.join(map(str, args.seeds))}"
    if args.against:
        command += f" --against {shown_path(args.against.resolve())}"
    result = {
        "command": command,
        "variants": {label: asdict(VARIANTS[label]) for label in labels},
        "cycles": cycles,
        "summary": summary,
    }
    if args.against:
        result["against"] = against(cycles, json.loads(args.against.read_text()))
        print_against(result["against"], args.against)
    print(f"wrote {write_result(out, result)}")


if __name__ == "__main__":
    main()

"""How a learned kernel model's correction is chosen, judged as a calibration judges it: every
learned family's held-out error beside its baseline's, refitted from stored calibrations under
each rule for "the candidate clearly beats the plain model".

    PYTHONPATH=. .venv/bin/python benchmarks/choice_rules.py FILES... [--rules folds rows] [--seed 0]

Rules (the test `predictors.learned_model._choose` applies to the cross-validated log errors):
- `folds` (what calibrations use): `evaluation.clearly_better_folds`, the gain over the folds'
  standard error corrected for the training rows the folds share (Nadeau and Bengio), against
  Student's t of k - 1 degrees of freedom;
- `folds_z`: the same against the normal threshold (2 standard errors);
- `rows`: `evaluation.clearly_better` over every row of every fold as if independent (the rule
  before it; its threshold now also Student's t, of n - 1 degrees, within 0.06 of the normal
  one from 50 rows up);
- `rows_nb`: the per-row standard error times the same correction's factor for rows that are
  independent within a fold, sqrt(1 + k / (k - 1)).

Each op is judged by 5-fold cross-validation in `fit_performance_model` (`--seed`), the same
fold draw for every rule, so the ratios are paired; collectives have no learned correction
and come out the same under every rule. FILES: gzipped rows or a calibration's
`measurements.jsonl`.

Writes benchmarks/results/choice_rules.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.correction_rows import stored_rows  # noqa: E402
from predictors import learned_model  # noqa: E402
from predictors.evaluation import clearly_better, clearly_better_folds  # noqa: E402
from predictors.fit import fit_performance_model, fold_pick, kernel_rows  # noqa: E402
from predictors.fit_pool import in_process  # noqa: E402
from probes.collective import merge_passes  # noqa: E402

OUT = REPO / "benchmarks/results/choice_rules.json"
Rule = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], float], bool]


def _rows(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], se: float) -> bool:
    return clearly_better(np.concatenate(reference), np.concatenate(candidate), se)


def _rows_nb(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], se: float) -> bool:
    k = len(reference)
    return k > 1 and clearly_better(np.concatenate(reference), np.concatenate(candidate), se * np.sqrt(1 + k / (k - 1)))


def _folds_z(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], se: float) -> bool:
    """`folds` with the normal threshold (`se` itself) in place of Student's t of k - 1 degrees
    of freedom (the rule before 11-28 19:00): the confidence whose t threshold is `se`."""
    k = len(reference)
    return k > 1 and clearly_better_folds(reference, candidate, float(stats.norm.ppf(stats.t.cdf(se, k - 1))))


RULES: dict[str, Rule] = {"folds": clearly_better_folds, "rows": _rows, "rows_nb": _rows_nb, "folds_z": _folds_z}


def judge(rows: list, rule: Rule, seed: int) -> dict:
    """Every kernel op fitted and judged as a calibration does (`fit_performance_model`), its
    learned models choosing by `rule`; each family pooled, and each op's pick."""
    saved = learned_model.clearly_better_folds
    learned_model.clearly_better_folds = rule  # type: ignore[assignment]
    try:
        # in this process: a worker of the pool would not see the rule patched in here
        model, _ = fit_performance_model(rows, "refit", seed, mapper=in_process)
    finally:
        learned_model.clearly_better_folds = saved
    families = {
        name: {k: stats[k] for k in ("gmae", "baseline_gmae", "n", "vs_baseline")}
        for name, stats in model.meta["family_heldout"].items()
    }
    chosen = {op: stats["chosen"] for op, stats in model.metrics.items() if stats.get("chosen")}
    by_fold = {op: stats["fold_picks"] for op, stats in model.metrics.items() if stats.get("fold_picks")}
    return {"families": families, "chosen": chosen, "fold_picks": by_fold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--rules", nargs="+", choices=sorted(RULES), default=["folds", "rows"])
    parser.add_argument("--seed", type=int, default=0, help="the fold draw's seed (calibrations use 0)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    runs = []
    for path in args.files:
        rows = kernel_rows(merge_passes(stored_rows(path)))  # as a calibration reads them
        fits = {}
        for name in args.rules:
            began = time.monotonic()
            fits[name] = judge(rows, RULES[name], args.seed)
            cells = [
                f"{family} {f['gmae']:.1%} / {f['baseline_gmae']:.1%} n={f['n']} "
                f"{f['vs_baseline']['ratio']:.2f} [{f['vs_baseline']['low']:.2f}, {f['vs_baseline']['high']:.2f}]"
                for family, f in fits[name]["families"].items()
            ]
            print(
                f"{Path(path).name} seed {args.seed} {name:<7} ({time.monotonic() - began:.0f} s): " + "; ".join(cells),
                flush=True,
            )
            for op, picks in fits[name]["fold_picks"].items():
                if len({p["chosen"] for p in picks}) > 1:  # the folds disagree: where a family's figure moves
                    print(f"  {op} by fold: " + ", ".join(fold_pick(p) for p in picks), flush=True)
        runs.append({"file": path, "rows": len(rows), "fits": fits})
    command = "python benchmarks/choice_rules.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(json.dumps({"command": command, "seed": args.seed, "runs": runs}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

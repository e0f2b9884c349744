"""Each op family's held-out error beside its baseline's, judged by 5-fold cross-validation
(what a calibration reports now) and by the seeded 20% split it reported before (#26).

    .venv/bin/python benchmarks/family_heldout.py ROWS [ROWS ...] --out RESULT.json

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`). For each, the kernel and
collective rows are fitted as `predictors.fit.fit_performance_model` fits them, and each
family's pooled GMAE, its baseline's on the same rows, the count and the paired ratio's 95%
interval are printed for both ways of holding rows out. A split holds out 6-9 rows of an op
and which ones it draws can put a family on either side of its baseline; the folds judge
every row once.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.evaluation import split_by_op  # noqa: E402
from predictors.fit import OpFit, family_heldout, fit_op, fit_performance_model, kernel_rows  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402


def split_fits(train: list[Measurement], test: list[Measurement], seed: int = 0) -> dict[str, OpFit]:
    """Each op fitted on its `train` rows and judged on its `test` rows (`predictors.fit.fit_op`),
    as a calibration judged its ops before #26; an op that cannot be fitted is left out."""
    by_op: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for part, items in enumerate((train, test)):
        for r in items:
            by_op[r.op][part].append(r)
    fits = {}
    for op, (op_train, op_test) in sorted(by_op.items()):
        try:
            fits[op] = fit_op(op, op_train, op_test, seed)
        except (ValueError, KeyError):
            continue
    return fits


def split_families(rows: list[Measurement], seed: int = 0) -> dict:
    """The families as the seeded 80/20 split judged them (each op fitted on its 80%)."""
    paired = defaultdict(list)
    for fit in split_fits(*split_by_op(rows, seed), seed).values():
        if fit.scored is not None:
            paired[fit.scored[0]].append(fit.scored[1:])
    return family_heldout(paired)


def at_or_under(stats: dict) -> bool:
    """Whether a family's GMAE is at or under its baseline's: by their paired ratio, which is
    1 up to rounding where every op of the family kept its baseline."""
    return stats["vs_baseline"]["ratio"] <= 1.0 + 1e-9


def line(family: str, how: str, s: dict) -> str:
    ratio = s["vs_baseline"]
    return (
        f"  {family:12s} {how:6s} GMAE {s['gmae']:6.1%}  baseline {s['baseline_gmae']:6.1%}  n={s['n']:4d}  "
        f"ratio {ratio['ratio']:.3f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", type=Path)
    parser.add_argument("--seed", type=int, default=0, help="the split's and the folds' seed (calibrations use 0)")
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    results = {}
    for path in args.rows:
        rows = kernel_rows(read_rows(path))
        t0 = time.perf_counter()
        model, _ = fit_performance_model(rows, "refit", seed=args.seed)
        fit_s = time.perf_counter() - t0
        folds, split = model.meta["family_heldout"], split_families(rows, args.seed)
        print(f"{path.name}: {len(rows)} kernel rows, 5-fold fit in {fit_s:.0f} s")
        for family in sorted(folds):
            print(line(family, "5-fold", folds[family]))
            if family in split:
                print(line(family, "split", split[family]))
        results[path.name] = {"five_fold": folds, "split": split, "fit_s": fit_s}
    not_over = {name: {family: at_or_under(s) for family, s in r["five_fold"].items()} for name, r in results.items()}
    print(
        "families at or under their baseline (5-fold): "
        + ", ".join(f"{name.split('.')[0]} {sum(v.values())}/{len(v)}" for name, v in not_over.items())
    )
    if args.out:
        command = " ".join(["benchmarks/family_heldout.py", *sys.argv[1:]])
        print(f"wrote {write_result(args.out, {'command': command, 'calibrations': results, 'not_over': not_over})}")


if __name__ == "__main__":
    main()

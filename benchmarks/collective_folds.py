"""Where a calibration's collective family stands against its alpha-beta baseline, fold by fold.

    .venv/bin/python benchmarks/collective_folds.py ROWS [ROWS ...] [--out RESULT.json]

ROWS: a calibration's `measurements.jsonl` (or `.jsonl.gz`). Each collective op is judged as
`predictors.fit.fit_performance_model` judges it (the same seeded folds, drawn over every op in
turn), and for every fold this prints the sigmoid model's and the baseline's held-out GMAE and
the transitions the fold's fit kept (breakpoints log2 m1, m2): a fold that kept a line prices
exactly as the baseline, so a family above its baseline is the folds whose kept transition lost.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.e2e_accuracy import write_result  # noqa: E402
from benchmarks.refit_e2e import read_rows  # noqa: E402
from predictors.collective_model import SigmoidCollectiveModel  # noqa: E402
from predictors.evaluation import CV_FOLDS, fold_assignment  # noqa: E402
from predictors.families import COLLECTIVES  # noqa: E402
from predictors.fit import family_heldout, fit_op, kernel_rows  # noqa: E402
from probes.vocabulary.records import Measurement  # noqa: E402


def transitions(model: SigmoidCollectiveModel) -> dict[str, list[float]]:
    """The groups whose curve kept a transition, with its breakpoints (log2 bytes)."""
    return {k: [c.x1, c.x2] for k, c in model.curves.items() if c.per_byte_s is None}


def op_folds(op: str, rows: list[Measurement], folds: np.ndarray) -> tuple[dict, list]:
    """One collective op's folds, each judged as the calibration judges it (`fit_op`): the
    fold's model and baseline GMAE and kept transitions; and the folds' paired (model,
    baseline) errors, for the family."""
    out, paired = [], []
    for fold in sorted(set(folds.tolist()) - {-1}):
        train = [r for r, f in zip(rows, folds) if f != fold]
        test = [r for r, f in zip(rows, folds) if f == fold]
        judged = fit_op(op, train, test)
        assert isinstance(judged.model, SigmoidCollectiveModel)
        out.append(
            {
                "fold": fold,
                "n": judged.stats["n"],
                "gmae": judged.stats["gmae"],
                "baseline_gmae": judged.stats["baseline_gmae"],
                "transitions": transitions(judged.model),
            }
        )
        if judged.scored is not None:
            paired.append(judged.scored[1:])
    whole = SigmoidCollectiveModel(op).fit(rows)
    pooled = family_heldout({op: paired})[op] if paired else {}
    summary = {k: pooled.get(k) for k in ("n", "gmae", "baseline_gmae")}
    return {**summary, "folds": out, "transitions_on_all_rows": transitions(whole)}, paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", type=Path, help="measurements.jsonl[.gz] of a calibration")
    parser.add_argument("--seed", type=int, default=0, help="the calibration's seed (its folds)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/collective_folds.json")
    args = parser.parse_args()
    for path in args.rows:
        if not path.is_file():
            parser.error(f"ROWS: no such file {path}")
    results = {}
    for path in args.rows:
        by_op: dict[str, list[Measurement]] = defaultdict(list)
        for r in kernel_rows(read_rows(path)):
            by_op[r.op].append(r)
        rng = np.random.default_rng(args.seed)
        ops, paired = {}, []
        for op, rows in sorted(by_op.items()):
            folds = fold_assignment(len(rows), rng, CV_FOLDS)  # drawn for every op, as the fit draws them
            if op not in COLLECTIVES:
                continue
            ops[op], op_paired = op_folds(op, rows, folds)
            paired += op_paired
            print(
                f"{path.name} {op:15s} n={ops[op]['n']:3d}  model {ops[op]['gmae']:.4f}  baseline {ops[op]['baseline_gmae']:.4f}"
            )
            for f in ops[op]["folds"]:
                kept = f["transitions"] or "line"
                print(
                    f"    fold {f['fold']}: n={f['n']}  model {f['gmae']:.4f}  baseline {f['baseline_gmae']:.4f}  {kept}"
                )
        family = family_heldout({"collective": paired})["collective"]
        print(
            f"{path.name} collective family: model {family['gmae']!r} baseline {family['baseline_gmae']!r} (n={family['n']})"
        )
        results[str(path)] = {"family": family, "ops": ops}
    write_result(args.out, {"command": " ".join(["python", *sys.argv]), "seed": args.seed, "calibrations": results})


if __name__ == "__main__":
    main()

"""How many rows a learned correction needs before it is tried: the element-wise family's
held-out error against its roofline baseline, refitted from stored calibrations under each
`MIN_ROWS_FOR_CORRECTION`.

    PYTHONPATH=. .venv/bin/python benchmarks/correction_rows.py [FILES...] [--min-rows 20 40 60]

A short calibration measures each element-wise op 20-35 times, so its corrections (an MLP or
gradient-boosted trees over 7 inputs: 6 shape and dtype features and the roofline's log time)
are chosen by 5-fold cross-validation on folds of 4-7 rows. Below the threshold the op takes its roofline base or baseline (whichever wins
with each row left out in turn). Each file's rows are split by the same seed for every
threshold, so the held-out rows are the same and the ratios are paired.

Writes benchmarks/results/correction_rows.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_FILES = sorted(str(p) for p in REPO.glob("benchmarks/results/e2e_issue26_*/measurements_*.jsonl.gz"))
OUT = REPO / "benchmarks/results/correction_rows.json"


def kernel_split(path: str, seed: int) -> tuple[list, list]:
    """The calibration's own split of its kernel rows (one seeded draw per op, every op in
    turn), then its element-wise rows only: the held-out rows the calibration scored."""
    from predictors.evaluation import split_by_op
    from predictors.fit import kernel_rows
    from probes.vocabulary.records import Measurement

    with gzip.open(path, "rt") as f:
        rows = [Measurement.from_row(json.loads(line)) for line in f if line.strip()]
    train, test = split_by_op(kernel_rows(rows), seed)
    return [r for r in train if r.family == "elementwise"], [r for r in test if r.family == "elementwise"]


def refit(train: list, test: list, min_rows: int, seed: int) -> dict:
    """Each element-wise op fitted and scored as the calibration scored it on its split
    (`family_heldout.split_fits`), under `min_rows`; the family pooled."""
    from benchmarks.family_heldout import split_fits
    from predictors import learned_model
    from predictors.fit import family_heldout

    saved = learned_model.MIN_ROWS_FOR_CORRECTION
    learned_model.MIN_ROWS_FOR_CORRECTION = min_rows
    try:
        fits = split_fits(train, test, seed)
    finally:
        learned_model.MIN_ROWS_FOR_CORRECTION = saved
    stats = {op: fit.stats for op, fit in fits.items()}
    pairs = [fit.scored[1:] for fit in fits.values() if fit.scored is not None]
    family = family_heldout({"elementwise": pairs})["elementwise"]
    return {
        "gmae": family["gmae"],
        "baseline_gmae": family["baseline_gmae"],
        "n": family["n"],
        "vs_baseline": family["vs_baseline"],
        "chosen": {op: s["chosen"] for op, s in stats.items()},
        "per_op_ratio": {op: (s.get("vs_baseline") or {}).get("ratio") for op, s in stats.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    parser.add_argument("--min-rows", type=int, nargs="+", default=[20, 40, 60])
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (calibrations use 0)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    results = []
    print(f"{'calibration':<44} {'rows/op':>7} | " + " | ".join(f"min {m:>3}: ratio [95%]" for m in args.min_rows))
    for path in args.files:
        train, test = kernel_split(path, args.seed)
        rows = train + test
        ops = {r.op for r in rows}
        fits = {m: refit(train, test, m, args.seed) for m in args.min_rows}
        results.append({"file": str(Path(path).relative_to(REPO)), "rows": len(rows), "ops": len(ops), "fits": fits})
        cells = []
        for m in args.min_rows:
            v = fits[m]["vs_baseline"]
            cells.append(f"{fits[m]['gmae']:6.1%} {v['ratio']:.2f} [{v['low']:.2f},{v['high']:.2f}]")
        print(
            f"{str(Path(path).relative_to(REPO / 'benchmarks/results')):<44} {len(rows) / max(len(ops), 1):>7.0f} | "
            + " | ".join(cells),
            flush=True,
        )
    Path(args.out).write_text(
        json.dumps(
            {"command": "python benchmarks/correction_rows.py " + " ".join(sys.argv[1:]), "runs": results}, indent=1
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""How many rows a learned correction needs before it is tried: the element-wise family's
held-out error against its roofline baseline, refitted from stored calibrations under each
`MIN_ROWS_FOR_CORRECTION`.

    PYTHONPATH=. .venv/bin/python benchmarks/correction_rows.py [FILES...] [--min-rows 20 40 60]
        [--judge split|folds]

A short calibration measures each element-wise op 20-35 times, so its corrections (an MLP or
gradient-boosted trees over 7 inputs: 6 shape and dtype features and the roofline's log time)
are chosen by 5-fold cross-validation on folds of 4-7 rows. Below the threshold the op takes its roofline base or baseline (whichever wins
with each row left out in turn). Each file's rows are split by the same seed for every
threshold, so the held-out rows are the same and the ratios are paired.

`--judge folds` instead refits every kernel row as a calibration does
(`predictors.fit.fit_performance_model`: each op judged by 5-fold cross-validation, the same
fold draw for every threshold) and reports every family's held-out ratio to its baseline, as
the calibration prints it. FILES may be gzipped rows or a calibration's `measurements.jsonl`.

Writes benchmarks/results/correction_rows.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_FILES = sorted(str(p) for p in REPO.glob("benchmarks/results/e2e_issue26_*/measurements_*.jsonl.gz"))
OUT = REPO / "benchmarks/results/correction_rows.json"


def stored_rows(path: str) -> list:
    """A calibration's rows, gzipped or as its `measurements.jsonl`, as stored."""
    from probes.vocabulary.records import Measurement

    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return [Measurement.from_row(json.loads(line)) for line in f if line.strip()]


def kernel_split(path: str, seed: int) -> tuple[list, list]:
    """The calibration's own split of its kernel rows (one seeded draw per op, every op in
    turn), then its element-wise rows only: the held-out rows the calibration scored."""
    from predictors.evaluation import split_by_op
    from predictors.fit import kernel_rows

    train, test = split_by_op(kernel_rows(stored_rows(path)), seed)
    return [r for r in train if r.family == "elementwise"], [r for r in test if r.family == "elementwise"]


@contextmanager
def min_rows_for_correction(min_rows: int) -> Iterator[None]:
    """`learned_model.MIN_ROWS_FOR_CORRECTION` set to `min_rows` while the block runs."""
    from predictors import learned_model

    saved = learned_model.MIN_ROWS_FOR_CORRECTION
    learned_model.MIN_ROWS_FOR_CORRECTION = min_rows
    try:
        yield
    finally:
        learned_model.MIN_ROWS_FOR_CORRECTION = saved


def refit(train: list, test: list, min_rows: int, seed: int) -> dict:
    """Each element-wise op fitted and scored as the calibration scored it on its split
    (`family_heldout.split_fits`), under `min_rows`; the family pooled."""
    from benchmarks.family_heldout import split_fits
    from predictors.fit import family_heldout

    with min_rows_for_correction(min_rows):
        fits = split_fits(train, test, seed)
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


def refit_folds(rows: list, min_rows: int, seed: int) -> dict:
    """Every kernel row refitted and judged as a calibration does, under `min_rows`: each
    family's held-out figures beside its baseline's."""
    from predictors.fit import fit_performance_model
    from predictors.fit_pool import in_process

    with min_rows_for_correction(min_rows):  # in this process: a pool's workers would not see it
        model, _ = fit_performance_model(rows, "refit", seed, mapper=in_process)
    return {
        family: {k: stats[k] for k in ("gmae", "baseline_gmae", "n", "vs_baseline")}
        for family, stats in model.meta["family_heldout"].items()
    }


def main_folds(files: list[str], min_rows: list[int], seed: int) -> list[dict]:
    """`--judge folds`: one line per file and threshold, every family's ratio [95%]."""
    from predictors.fit import kernel_rows
    from probes.collective import merge_passes

    results = []
    for path in files:
        # read as the calibration reads them (`MeasurementStore.rows`): a collective point of
        # several sweep passes is one row
        rows = kernel_rows(merge_passes(stored_rows(path)))
        fits = {m: refit_folds(rows, m, seed) for m in min_rows}
        results.append({"file": path, "rows": len(rows), "fits": fits})
        for m, families in fits.items():
            cells = [
                f"{name} {f['gmae']:.1%} / {f['baseline_gmae']:.1%} n={f['n']} "
                f"{f['vs_baseline']['ratio']:.2f} [{f['vs_baseline']['low']:.2f}, {f['vs_baseline']['high']:.2f}]"
                for name, f in families.items()
            ]
            print(f"{path}  min {m}: " + "; ".join(cells), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    parser.add_argument("--min-rows", type=int, nargs="+", default=[20, 40, 60])
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (calibrations use 0)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--judge", choices=("split", "folds"), default="split", help="see the module's docstring")
    args = parser.parse_args()
    command = "python benchmarks/correction_rows.py " + " ".join(sys.argv[1:])
    if args.judge == "folds":
        runs = main_folds(args.files, args.min_rows, args.seed)
        Path(args.out).write_text(json.dumps({"command": command, "runs": runs}, indent=1))
        print(f"wrote {args.out}")
        return
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
    Path(args.out).write_text(json.dumps({"command": command, "runs": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

#!/bin/bash
# One #26 cycle: a fresh calibration into a fresh store, then both e2e benchmarks against it,
# the host sampler beside; and the keeping of a finished cycle's files in the repository.
#
#   benchmarks/issue26_cycle.sh run DIR [SEED]      # about 45 min on 2 cores; nothing else running
#   benchmarks/issue26_cycle.sh store DIR HHMM YYYYMMDD
#
# `run` uses the code of the checkout it is started from (a worktree keeps that code fixed while
# the main checkout changes) and the interpreter in $PY (default: .venv/bin/python of this
# checkout). SEED is the calibration's; a fresh one is drawn when it is left out, and the e2e
# benchmarks draw their own. `store` copies the calibration's measurements and fingerprint (what
# `calibrate --refit` needs), the host samples, the printed calibration summary and both
# benchmarks' JSON under benchmarks/results/e2e_issue26_YYYYMMDD/ (or $RESULTS/...), with the
# local paths removed.
set -euo pipefail
CODE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$CODE/.venv/bin/python}

run() {
    local X=$1 SEED=${2:-$("$PY" -c 'import random; print(random.randrange(2**31))')}
    mkdir -p "$X"
    X=$(cd "$X" && pwd)
    cd "$CODE"
    export AUTOTUNE_HOME=$X/home PYTHONPATH=$CODE TQDM_DISABLE=1
    unset MLFLOW_TRACKING_URI
    local URI=sqlite:///$X/mlflow.db
    echo "code $(git -C "$CODE" rev-parse HEAD) seed $SEED" > "$X/cycle"
    echo "$CODE" > "$X/code_dir"
    "$PY" benchmarks/host_canary.py sample --out "$X/canary.jsonl" --every-s 5 --for-s 4000 \
        > "$X/canary.log" 2>&1 &
    CANARY=$!  # global: the trap runs after this function has returned
    trap 'kill $CANARY 2>/dev/null || true' EXIT
    "$PY" -m orchestrator.cli.calibrate --budget-s 600 --seed "$SEED" --tracking-uri "$URI" \
        > "$X/calibrate.log" 2>&1
    local CAL
    CAL=$(ls -d "$X"/home/calibrations/*/ | tail -1)
    echo "caldir $CAL" > "$X/caldir"
    local CHECKS=(--tracking-uri "$URI" --rounds 3 --host-check "$CAL" --host-check-points 40 --step-checks 4)
    "$PY" benchmarks/e2e_accuracy.py --tasks 12 --scale 1 "${CHECKS[@]}" --out "$X/dlrm.json" \
        > "$X/dlrm.log" 2>&1
    "$PY" benchmarks/e2e_accuracy_transformer.py --tasks 12 "${CHECKS[@]}" --out "$X/transformer.json" \
        > "$X/transformer.log" 2>&1
    pkill -f TrainController || true  # a run's leftover train workers, which would load the next
    echo done > "$X/done"
}

store() {
    local X T=$2 D=$3
    X=$(cd "$1" && pwd)  # as `run` wrote it into the files: absolute, so the paths strip
    cd "$CODE"
    local OUT=${RESULTS:-benchmarks/results}/e2e_issue26_$D CAL RAN
    RAN=$(cat "$X/code_dir" 2>/dev/null || echo "$CODE")
    mkdir -p "$OUT"
    CAL=$(awk '{print $2}' "$X/caldir")
    gzip -c "$CAL/measurements.jsonl" > "$OUT/measurements_$T.jsonl.gz"
    install -m 644 "$CAL/fingerprint.json" "$OUT/fingerprint_$T.json"
    gzip -c "$X/canary.jsonl" > "$OUT/canary_$T.jsonl.gz"
    grep '^\[autotune\]' "$X/calibrate.log" > "$OUT/calibration_$T.txt" || true
    cp "$X/dlrm.json" "$OUT/dlrm_$T.json"
    cp "$X/transformer.json" "$OUT/transformer_$T.json"
    "$PY" benchmarks/host_canary.py join "$X/canary.jsonl" "$X/dlrm.json" "$X/transformer.json" \
        --out "$OUT/canary_join_$T.json"
    sed -i "s#$CODE/##g; s#$RAN/##g; s#$X/##g" "$OUT/calibration_$T.txt" "$OUT/dlrm_$T.json" \
        "$OUT/transformer_$T.json" "$OUT/canary_join_$T.json"
    ls -la "$OUT" | grep "_$T"
}

case ${1:-} in
    run) shift; run "$@" ;;
    store) shift; store "$@" ;;
    *) echo "usage: $0 run DIR [SEED] | store DIR HHMM YYYYMMDD" >&2; exit 2 ;;
esac

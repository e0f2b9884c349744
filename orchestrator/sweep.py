"""A sweep job through autotune: the fusion width from the hardware's bundle, the sweep run fused
through Ray Tune, and the width's predicted throughput set against what the sweep measured.

The width comes from the champion's fusion curve of the sweep's workload (the calibration
measures the reference workloads'). Where the bundle has none that describes the sweep (a
user's own model, another batch size or optimizer, or a calibration too short to measure three
widths), the workload's widths are probed first, each in a fresh worker as the calibration
does, and the curve fitted from them is the one used and logged. Everything lands in the
autotune run: the curve and the policy's candidates, the chosen width, predicted and measured
throughput, and every trial's config, group and validation history.
"""

from __future__ import annotations

import time
from typing import Any

import mlflow
from ray import tune

from orchestrator.cluster import HardwareFingerprint
from orchestrator.defaults import FUSION_MEMORY_SHARE
from orchestrator.fusion import log_fusion_decision, probe_fusion, widths_at_once
from orchestrator.fusion_tune import SweepOutcome, run_sweep, sample_trials
from orchestrator.home import home_path
from orchestrator.measurement_store import MeasurementStore
from orchestrator.progress import say
from policies.fusion_width import choose_width
from predictors.fusion_model import FusionModel, FusionModelError, fit_fusion_models
from predictors.performance_model import PerformanceModel
from probes.vocabulary.sweep_job import SweepJob
from probes.workloads.fusion.models import workload

PROBE_SECONDS = 1.0  # timed seconds per width when a sweep's own widths are probed


def tune_space(space: dict[str, Any]) -> dict[str, Any]:
    """The job file's search space (`{domain: [...]}` or a constant) as Tune's objects."""
    out: dict[str, Any] = {}
    for key, value in space.items():
        if not isinstance(value, dict):
            out[key] = value
            continue
        (domain, values), *_ = value.items()
        if domain == "grid_search":
            out[key] = tune.grid_search(list(values))
        elif domain == "choice":
            out[key] = tune.choice(list(values))
        elif domain == "randint":
            out[key] = tune.randint(int(values[0]), int(values[1]))
        else:
            out[key] = getattr(tune, domain)(float(values[0]), float(values[1]))
    return out


def memory_cap_bytes(job: SweepJob, fp: HardwareFingerprint) -> float:
    """What a fused job may hold: the device's memory less what the job leaves free, else the
    policy's default share of it."""
    total = fp.min_device_memory_bytes
    if job.memory_free_gb is None:
        return FUSION_MEMORY_SHARE * total
    return max(0.0, total - job.memory_free_gb * 2**30)


def sweep_batch_size(job: SweepJob) -> int:
    """The per-model batch size the fused jobs train at: the search space's constant, else the
    workload's own (a batch-size domain splits the sweep into groups per size; the width is
    chosen for the workload's)."""
    value = job.search_space.get("batch_size")
    return int(value) if isinstance(value, int) else workload(job.workload_ref).batch_size


def fusion_curve(
    job: SweepJob, bundle: PerformanceModel | None, fp: HardwareFingerprint, cap: float
) -> tuple[FusionModel, str]:
    """The fusion curve the width is chosen on, and where it came from."""
    batch_size = sweep_batch_size(job)
    registered = bundle.fusion.get(job.workload_ref) if bundle is not None else None
    if registered is not None and (registered.batch_size, registered.optimizer) == (batch_size, job.optimizer):
        return registered, "registered"
    why = (
        "the bundle has no fusion curve for it"
        if registered is None
        else f"the bundle's was measured at batch {registered.batch_size} with {registered.optimizer}"
    )
    store = MeasurementStore(home_path("fusion") / time.strftime("%Y%m%d-%H%M%S"))
    say(f"probing the fusion widths of {job.workload_ref} ({why}); rows in {store.rows_path}")
    rows = probe_fusion(
        [job.workload_ref],
        store,
        job.max_width,
        cap,
        batch_size=batch_size,
        optimizer=job.optimizer,
        device_kind=fp.device_kind,
        parallel=widths_at_once(fp),
        max_seconds=PROBE_SECONDS,
        seed=job.seed,
    )
    if store.rows_path.exists():  # none when every width failed (each failure is in the store)
        mlflow.log_artifact(str(store.rows_path), "fusion")
    try:
        return fit_fusion_models(rows)[job.workload_ref], "probed for this sweep"
    except (KeyError, FusionModelError) as exc:
        raise FusionModelError(
            f"{job.workload_ref}: too few widths measured to choose one ({exc}); see {store.directory}"
        ) from None


def run_fusion_sweep(job: SweepJob, bundle: PerformanceModel | None, fp: HardwareFingerprint) -> dict[str, Any]:
    """Choose the width, run the sweep fused, log predicted vs measured and every trial;
    returns the summary's fields."""
    cap = memory_cap_bytes(job, fp)
    curve, source = fusion_curve(job, bundle, fp, cap)
    # never wider than a width measured: past it the curve is a guess (a calibration's fusion
    # phase can end at its deadline, not at the device's memory)
    widest = min(job.max_width, max(curve.widths))
    if widest < job.max_width:
        say(f"widths above {widest} were never measured for {job.workload_ref}: choosing up to {widest}")
    decision = choose_width(curve, cap, widest)
    chosen = decision.choice_detail
    width = int(chosen["width"])
    trials = sample_trials(tune_space(job.search_space), job.trials, job.seed)
    say(
        f"sweep: {len(trials)} trial(s) of {job.workload_ref}, fused {width} per device (curve {source}): "
        f"predicted {chosen['samples_per_s']:.0f} samples/s per fused job ({chosen['speedup_vs_one']:.2f}x one model)"
    )
    log_fusion_decision(curve, decision, source=source)
    mlflow.log_table(
        {
            "width": [c.detail.get("width") for c in decision.candidates],
            "predicted_samples_per_s": [c.detail.get("samples_per_s") for c in decision.candidates],
            "feasible": [c.feasible for c in decision.candidates],
            "chosen": [c.name == decision.choice for c in decision.candidates],
        },
        "fusion_candidates.json",
    )
    outcome = run_sweep(
        job.workload_ref,
        trials,
        width,
        job.epochs,
        job.steps_per_epoch,
        storage=home_path("sweeps"),
        name=f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}",
        data_seed=job.seed,
        device_kind=fp.device_kind,
    )
    measured = outcome.measured_samples_per_s(width)
    log_trials(outcome)
    metrics = {
        "chosen_width": width,
        "predicted_samples_per_s": chosen["samples_per_s"],
        "sweep_wall_s": outcome.wall_s,
    }
    out: dict[str, Any] = {
        "width": width,
        "curve": source,
        "trials": len(outcome.trials),
        "groups": [len(g) for g in outcome.groups],
        "predicted_samples_per_s": chosen["samples_per_s"],
        "measured_samples_per_s": measured,
        "sweep_wall_s": outcome.wall_s,
    }
    if measured is not None:
        error = abs(chosen["samples_per_s"] - measured) / measured
        metrics.update(measured_samples_per_s=measured, throughput_error=error)
        out["throughput_error"] = error
    mlflow.log_metrics(metrics)
    best = outcome.best()
    out["best_trial"] = {"trial_id": best.trial_id, "config": best.config, **best.final}
    say(
        f"swept {len(outcome.trials)} trial(s) in {len(outcome.groups)} fused job(s) in {outcome.wall_s:.0f}s; "
        + (f"measured {measured:.0f} samples/s per {width}-wide job" if measured is not None else "no full-width job")
        + f"; best {best.trial_id} val_loss {best.final.get('val_loss', float('nan')):.4f} {best.config}"
    )
    return out


def log_trials(outcome: SweepOutcome) -> None:
    """Every trial in one table (config, group, final metrics) and each one's history."""
    keys = sorted({k for t in outcome.trials for k in t.config})
    table: dict[str, list[Any]] = {"trial_id": [], "group": [], "group_width": [], "val_loss": [], "val_accuracy": []}
    table.update({f"config.{k}": [] for k in keys})
    for t in outcome.trials:
        table["trial_id"].append(t.trial_id)
        table["group"].append(t.group)
        table["group_width"].append(t.group_width)
        table["val_loss"].append(t.final.get("val_loss"))
        table["val_accuracy"].append(t.final.get("val_accuracy"))
        for k in keys:
            table[f"config.{k}"].append(t.config.get(k))
    mlflow.log_table(table, "trials.json")
    mlflow.log_dict({t.trial_id: t.history for t in outcome.trials}, "trial_histories.json")

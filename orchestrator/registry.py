"""MLflow as the memory: calibration runs, the per-hardware model registry, champion rules.

One registered model per hardware_id (`perfmodel-<hardware_id>`); its versions are
PerformanceModel bundles stored as JSON artifacts. Alias `champion` marks the version plans use;
a new version takes it only when it is not worse than the current champion on the new
held-out rows (the champion is re-scored on them), else it gets alias `challenger`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

from orchestrator.defaults import DEFAULT_MODEL_AGE_DAYS
from orchestrator.home import default_tracking_uri
from orchestrator.progress import quieten_libraries, verbose
from predictors.evaluation import geomean
from predictors.performance_model import MODEL_FILE, PerformanceModel
from predictors.step_fit import STEP_WORKLOADS
from probes.vocabulary.ops import IN_STEP_COLLECTIVE_OP
from probes.vocabulary.records import Measurement, measurements_to_frame

EXPERIMENT = "autotune"
CHAMPION, CHALLENGER, CANDIDATE = "champion", "challenger", "candidate"
PYFUNC_CODE = str(Path(__file__).with_name("pyfunc_model.py"))
BUNDLE_ARTIFACT = "performance_model"
# What `mlflow.pyfunc.load_model(...).predict` takes and gives (orchestrator/pyfunc_model.py):
# one row per op to price, its parameters as a JSON object; seconds out.
PYFUNC_SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", "op"), ColSpec("string", "params")]), outputs=Schema([ColSpec("double")])
)


def resolve_tracking_uri(uri: str | None) -> str:
    """--tracking-uri, else MLFLOW_TRACKING_URI, else sqlite:///$AUTOTUNE_HOME/mlflow.db."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def configure(uri: str | None) -> str:
    """Point MLflow at `uri` and make sure our experiment exists (artifacts beside a sqlite db)."""
    uri = resolve_tracking_uri(uri)
    quieten_libraries()  # importing mlflow set up its own loggers
    mlflow.set_tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        # MLflow creates and migrates a new sqlite store on first touch; processes started
        # together (two autotunes and a nightly) would race that migration.
        from filelock import FileLock

        db = Path(uri[len("sqlite:///") :]).resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(db) + ".init.lock"):
            mlflow.get_experiment_by_name(EXPERIMENT)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        location = None
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///") :]).resolve()
            location = (db.parent / "mlartifacts").as_uri()
        try:
            mlflow.create_experiment(EXPERIMENT, artifact_location=location)
        except MlflowException:
            pass  # created concurrently
    mlflow.set_experiment(EXPERIMENT)
    return uri


def model_name(hardware_id: str) -> str:
    return f"perfmodel-{hardware_id}"


@dataclass
class RegisteredBundle:
    name: str
    version: str
    tags: dict[str, str]
    created_ms: int
    model: PerformanceModel

    @property
    def age_days(self) -> float:
        return (time.time() * 1000 - self.created_ms) / 86_400_000


def _read_bundle(name: str, version: str) -> PerformanceModel:
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(f"models:/{name}/{version}", dst_path=tmp)
        found = list(Path(local).rglob(MODEL_FILE))
        if not found:
            raise FileNotFoundError(f"model {name} v{version} has no {MODEL_FILE}")
        return PerformanceModel.load_dir(found[0].parent)


class RegistryUnavailable(RuntimeError):
    """The tracking server kept failing: nothing may be concluded (least of all "no champion")."""


RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0)  # backoff between tries of a failing tracking-server call
# Answers, not failures: raised at once, never retried.
DEFINITE = {
    "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS",
    "INVALID_PARAMETER_VALUE",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "BAD_REQUEST",
}


def is_not_found(exc: MlflowException) -> bool:
    """A definite answer that the model or alias does not exist (not a transient failure)."""
    code = getattr(exc, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(exc))


def is_denied(exc: MlflowException) -> bool:
    return getattr(exc, "error_code", "") == "PERMISSION_DENIED"


def _model_exists(client: MlflowClient, name: str) -> bool:
    """Whether registered model `name` exists. MLflow's basic-auth server answers an alias
    lookup on a model that does not exist (yet: new hardware) with 403, not 404, and the
    model itself with 404 under the default read permission; a 403 there too is re-raised."""
    try:
        with_retries(lambda: client.get_registered_model(name), f"reading {name}")
    except MlflowException as exc:
        if is_not_found(exc):
            return False
        raise
    return True


def with_retries(call: Callable[[], Any], what: str, waits: Sequence[float] | None = None) -> Any:
    """`call()`, retried with backoff while the tracking server fails transiently (a 503, a
    dropped connection); a definite answer (not found, already exists, refused) is raised at
    once; after the last try,
    `RegistryUnavailable`: callers fail closed instead of reading an error as "nothing there"."""
    waits = RETRY_WAITS_S if waits is None else waits
    last: Exception | None = None
    for attempt in range(len(waits) + 1):
        try:
            return call()
        except MlflowException as exc:
            if getattr(exc, "error_code", "") in DEFINITE:
                raise
            last = exc
        except OSError as exc:  # a connection refused or reset below MLflow's own retries
            last = exc
        if attempt < len(waits):
            time.sleep(waits[attempt])
    raise RegistryUnavailable(f"{what}: the tracking server failed {len(waits) + 1} times: {last}") from last


def get_alias(hardware_id: str, alias: str = CHAMPION) -> RegisteredBundle | None:
    """The version under `alias` for `hardware_id`; None only when the server says there is
    none (a transient error is retried, then raised as `RegistryUnavailable`)."""
    client = MlflowClient()
    name = model_name(hardware_id)
    try:
        mv = with_retries(lambda: client.get_model_version_by_alias(name, alias), f"reading {name}@{alias}")
    except MlflowException as exc:
        if is_not_found(exc) or (is_denied(exc) and not _model_exists(client, name)):
            return None
        raise
    bundle = with_retries(lambda: _read_bundle(name, mv.version), f"reading {name} v{mv.version}")
    return RegisteredBundle(name, str(mv.version), dict(mv.tags), int(mv.creation_timestamp), bundle)


def load_performance_model(tracking_uri: str | None, hardware_id: str, alias: str = CHAMPION) -> PerformanceModel:
    configure(tracking_uri)
    found = get_alias(hardware_id, alias)
    if found is None:
        raise LookupError(
            f"no model registered as {model_name(hardware_id)}@{alias} at {resolve_tracking_uri(tracking_uri)}"
        )
    return found.model


@dataclass
class Freshness:
    fresh: bool
    reasons: list[str] = field(default_factory=list)


def check_freshness(
    champion: RegisteredBundle | None,
    software: dict[str, str],
    max_age_days: float = DEFAULT_MODEL_AGE_DAYS,
    drift_bound: float = 0.5,
    drift_window: int = 5,
) -> Freshness:
    """Missing, older than `max_age_days`, built on other software, or drifting → not fresh.

    Drifting: the geomean prediction error of the last `drift_window` jobs planned with this
    version exceeds `drift_bound` (needs at least 3 such jobs).
    """
    if champion is None:
        return Freshness(False, ["no champion model for this hardware"])
    reasons = []
    if champion.age_days > max_age_days:
        reasons.append(f"champion v{champion.version} is {champion.age_days:.1f} days old (> {max_age_days})")
    recorded = json.loads(champion.tags.get("software", "{}"))
    changed = {k: (recorded.get(k), v) for k, v in software.items() if recorded.get(k) != v}
    if changed:
        reasons.append(
            "software changed since calibration: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
        )
    errors = recent_prediction_errors(champion.name, champion.version, drift_window)
    if len(errors) >= 3:
        gm = geomean(errors)
        if gm > drift_bound:
            reasons.append(
                f"prediction drift: geomean error {gm:.1%} over the last {len(errors)} jobs > {drift_bound:.0%}"
            )
    return Freshness(not reasons, reasons)


def recent_prediction_errors(name: str, version: str, limit: int) -> list[float]:
    runs = mlflow.search_runs(
        experiment_names=[EXPERIMENT],
        filter_string=f"tags.model_name = '{name}' and tags.model_version = '{version}' and metrics.prediction_error >= 0",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
        output_format="list",
    )
    return [r.data.metrics["prediction_error"] for r in runs]


def log_measurements(rows: Sequence[Measurement], hardware_id: str, failures: Sequence[dict] = ()) -> None:
    """The table as parquet and as an MLflow dataset input of the active run."""
    frame = measurements_to_frame(rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "measurements.parquet"
        frame.to_parquet(path, index=False)
        mlflow.log_artifact(str(path))
        if failures:
            fpath = Path(tmp) / "failures.json"
            fpath.write_text(json.dumps(list(failures), indent=1))
            mlflow.log_artifact(str(fpath))
    dataset = mlflow.data.from_pandas(frame, name=f"measurements-{hardware_id}")
    mlflow.log_input(dataset, context="calibration")
    counts = frame["op"].value_counts().to_dict() if len(frame) else {}
    mlflow.log_metrics({f"rows.{op}": float(n) for op, n in counts.items()})
    mlflow.log_metric("probe_failures", float(len(failures)))


# An op's held-out figures; each workload's in-step collective factors' (under
# `in_step_collective.<workload>`) add their verdict and what it rests on: the held-out
# collectives' totals, and the workload's steps (`predictors.step_fit.fit_steps`)
HELD_OUT_KEYS = (
    *("gmae", "mape", "std", "baseline_gmae", "gmae_low", "gmae_high"),
    *("total_error", "baseline_total_error", "borne_out", "steps_gmae", "baseline_steps_gmae", "kept"),
)


def log_model_metrics(model: PerformanceModel, model_id: str | None = None) -> None:
    """The bundle's held-out (and leave-one-out) figures per op, in one batch, on the run and,
    with `model_id`, on the logged model they describe. Logged after the model: MLflow links
    every metric already on the run to a model it logs by reading each one's history back, a
    request per metric."""
    metrics = {}
    for op, stats in model.metrics.items():
        # whole steps are judged each left out in turn; every other op out of its fold (or, in
        # a bundle from before #26, on a split)
        prefix = "leave_one_out" if stats.get("judged") == "leave-one-out" else "heldout"
        parts = {op: stats}
        if op == IN_STEP_COLLECTIVE_OP:  # one verdict per workload
            parts = {f"{op}.{w}": stats[w] for w in STEP_WORKLOADS.values() if isinstance(stats.get(w), dict)}
        for name, part in parts.items():
            for key in HELD_OUT_KEYS:
                value = part.get(key)
                if value is not None and math.isfinite(value):
                    metrics[f"{prefix}.{name}.{key}"] = float(value)
            metrics[f"{prefix}.{name}.n_test"] = float(part.get("n", 0))
    for family, stats in model.meta.get("family_heldout", {}).items():
        ratio = stats.get("vs_baseline", {})
        for key, value in (
            ("gmae", stats.get("gmae")),
            ("baseline_gmae", stats.get("baseline_gmae")),
            ("n_test", stats.get("n")),
            ("ratio", ratio.get("ratio")),
            ("ratio_low", ratio.get("low")),
            ("ratio_high", ratio.get("high")),
        ):
            if value is not None and math.isfinite(value):
                metrics[f"heldout_family.{family}.{key}"] = float(value)
    mlflow.log_metrics(metrics, model_id=model_id)


def left_out_scores(model: PerformanceModel) -> dict[str, dict[str, Any]]:
    """The bundle's figures for the ops it fitted on all of its rows and judged with each row
    left out of the fit (kernels and collectives by k-fold, `predictors.fit.cross_validate_op`;
    whole training steps each in turn, `predictors.opmodels.fit_step_overhead`): for those rows
    they are its held-out scores, and re-predicting the rows would score it on what it saw."""
    return {op: stats for op, stats in model.metrics.items() if stats.get("judged")}


def _aggregate_gmae(stats: dict[str, Any]) -> float:
    """Geometric mean over ops of each op's GMAE (a metric with none, such as the in-step
    collective factors' per-workload verdicts, is no op's error)."""
    values = [s.get("gmae") if isinstance(s, dict) else s.gmae for s in stats.values()]
    values = [v for v in values if v is not None and math.isfinite(v)]
    return geomean(values) if values else float("inf")


@dataclass
class Registration:
    name: str
    version: str
    promoted: bool
    reason: str


Scorer = Callable[[PerformanceModel, Sequence[Measurement]], dict[str, Any]]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Warnings off and stderr to nowhere, for a call that only chatters there."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def register_bundle(
    model: PerformanceModel,
    test_rows: Sequence[Measurement],
    software: dict[str, str],
    scorer: Scorer | None = None,
    below_floor: Sequence[str] = (),
    lease: Any = None,
) -> Registration:
    """Log `model` to the active run, register it, and apply the champion rule.

    `scorer(bundle, rows) -> {op: ErrorStats}` scores a bundle on held-out rows; the default
    scores per-op models only, callers add composite checks (whole training steps).
    `below_floor`: why the bundle cannot plan (missing ops, held-out error over the bound):
    then it is registered as a `candidate`, never promoted. `lease` (`orchestrator.lease`): the
    lock every promoter takes; the compare-and-set happens only while it is still held. A
    tracking server that keeps failing raises `RegistryUnavailable`: nothing is promoted.
    """
    scorer = scorer or (lambda bundle, rows: bundle.score(rows))
    client = MlflowClient()
    name = model_name(model.hardware_id)
    with tempfile.TemporaryDirectory() as tmp:
        path = model.save(tmp)
        # MLflow prints hints about the code-based pyfunc and "Successfully registered ..." straight
        # to stderr (not through its loggers): kept for --verbose; its errors still raise here
        quiet = warnings.catch_warnings() if verbose() else _quiet_stderr()
        with quiet:
            info = mlflow.pyfunc.log_model(
                name=BUNDLE_ARTIFACT,
                python_model=PYFUNC_CODE,
                artifacts={BUNDLE_ARTIFACT: str(path)},
                registered_model_name=name,
                pip_requirements=["cluster-autotune"],
                signature=PYFUNC_SIGNATURE,
            )
    log_model_metrics(model, info.model_id)
    version = str(info.registered_model_version)
    new_gmae = _aggregate_gmae(model.metrics)
    tags = {
        "hardware_id": model.hardware_id,
        "software": json.dumps(software, sort_keys=True),
        "heldout_gmae": f"{new_gmae:.6f}",
        "run_id": mlflow.active_run().info.run_id,
    }
    # one tag, not one per op: each is a request, and an authenticating server takes a
    # fraction of a second over each
    tags["heldout_gmae_per_op"] = json.dumps(
        {op: round(float(stats["gmae"]), 6) for op, stats in model.metrics.items() if "gmae" in stats}, sort_keys=True
    )
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.set_registered_model_tag(name, "hardware_id", model.hardware_id)

    champion = get_alias(model.hardware_id, CHAMPION)
    if below_floor:
        promoted, reason = False, "below the quality floor: " + "; ".join(below_floor)
    elif champion is None:
        promoted, reason = True, "first model for this hardware"
    else:
        # Both bundles scored on the *new* held-out rows, on the ops both model: the only fair
        # comparison (the champion never saw these rows; the new bundle fitted on them and judged
        # each out of its fold or left out in turn: those scores are its own figures).
        old_scores = scorer(champion.model, test_rows)
        own = left_out_scores(model)
        new_scores = {**scorer(model, [r for r in test_rows if r.op not in own]), **own}
        new_scores = {op: s for op, s in new_scores.items() if op in old_scores}
        old_scores = {op: s for op, s in old_scores.items() if op in new_scores}
        new_gmae, old_gmae = _aggregate_gmae(new_scores), _aggregate_gmae(old_scores)
        promoted = new_gmae <= old_gmae
        verdict = "not worse than" if promoted else "worse than"
        reason = (
            f"held-out GMAE {new_gmae:.2%} is {verdict} champion v{champion.version}'s {old_gmae:.2%} on the same rows"
        )
    if promoted and lease is not None and not lease.held():
        promoted, reason = False, f"not promoted: the promotion lock ({lease.name}) expired before the compare-and-set"
    alias = CHAMPION if promoted else CANDIDATE if below_floor else CHALLENGER
    with_retries(lambda: client.set_registered_model_alias(name, alias, version), f"setting {name}@{alias}")
    with_retries(lambda: client.set_model_version_tag(name, version, "promotion", reason), f"tagging {name} v{version}")
    mlflow.set_tags(
        {"registered_model": name, "registered_version": version, "promoted": str(promoted), "promotion_reason": reason}
    )
    return Registration(name, version, promoted, reason)

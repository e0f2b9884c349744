"""`Decision` and `Plan`: what was chosen, and every alternative with its predicted time."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from probes.vocabulary.files import atomic_write_text
from probes.vocabulary.placement import PlacementError, RankPlacement


class PlanError(ValueError):
    """A plan file or dict that is not a plan (of this job); `field` is where, in the plan."""

    def __init__(self, message: str, field: str = "--plan"):
        self.field = field
        super().__init__(message)


def _expect(ok: bool, field: str, expected: str, got: Any) -> None:
    if not ok:
        text = repr(got)
        raise PlanError(f"{field}: expected {expected}, got {text[:200] + '...' if len(text) > 200 else text}", field)


def _require(data: dict, key: str, where: str) -> None:
    if key not in data:
        raise PlanError(f"{where}{key}: required field is missing", f"{where}{key}")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _check_decision_fields(where: str, data: Any) -> None:
    """A decision is a mapping with its required fields, the scalar ones of the right type."""
    _expect(isinstance(data, dict), where, "a mapping {policy, choice, predicted_ms, candidates, choice_detail}", data)
    for key in ("policy", "choice", "predicted_ms", "candidates"):
        _require(data, key, f"{where}.")
    _expect(isinstance(data["policy"], str), f"{where}.policy", "a string", data["policy"])
    _expect(isinstance(data["choice"], str), f"{where}.choice", "a string", data["choice"])
    _expect(
        data["predicted_ms"] is None or _is_number(data["predicted_ms"]),
        f"{where}.predicted_ms",
        "a finite number of milliseconds",
        data["predicted_ms"],
    )


def _check_candidates(where: str, candidates: Any) -> None:
    """A list of {name, predicted_ms, feasible, detail?} mappings."""
    _expect(isinstance(candidates, list), f"{where}.candidates", "a list of candidates", candidates)
    allowed = {"name", "predicted_ms", "feasible", "detail"}
    for i, c in enumerate(candidates):
        at = f"{where}.candidates[{i}]"
        _expect(
            isinstance(c, dict) and {"name", "predicted_ms", "feasible"} <= set(c) and set(c) <= allowed,
            at,
            f"a mapping with fields {sorted(allowed)} (detail optional)",
            c,
        )
        _expect(
            c["predicted_ms"] is None or _is_number(c["predicted_ms"]),
            f"{at}.predicted_ms",
            "a finite number or null",
            c["predicted_ms"],
        )
        _expect(isinstance(c.get("detail", {}), dict), f"{at}.detail", "a mapping", c.get("detail"))


def _check_table_to_rank(where: str, detail: dict) -> None:
    """The sharding decision's placement: one entry per table, a rank or {type, ranks}."""
    t2r: Any = detail.get("table_to_rank")
    _expect(
        isinstance(t2r, list) and bool(t2r),
        f"{where}.choice_detail.table_to_rank",
        "a non-empty list with one entry per table (a rank, or {type, ranks})",
        t2r,
    )
    _expect(
        all((isinstance(e, int) and not isinstance(e, bool)) or isinstance(e, dict) for e in t2r),
        f"{where}.choice_detail.table_to_rank",
        "entries that are a rank or a mapping {type, ranks}",
        t2r,
    )


def _check_choice_detail(name: str, where: str, detail: dict) -> None:
    """What the launcher reads of the chosen sharding, chunking or substitution."""
    if name == "sharding":
        _check_table_to_rank(where, detail)
    if name == "chunking":
        _expect(
            isinstance(detail.get("chunk_schedule"), dict),
            f"{where}.choice_detail.chunk_schedule",
            "a chunk schedule mapping",
            detail.get("chunk_schedule"),
        )
    if name == "parallelism":
        _expect(
            isinstance(detail.get("layout"), dict),
            f"{where}.choice_detail.layout",
            "the chosen layout (a transformer spec mapping)",
            detail.get("layout"),
        )
    if name == "substitution" and "substitutions" in detail:
        subs = detail["substitutions"]
        _expect(
            isinstance(subs, dict)
            and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in subs.items()
            ),
            f"{where}.choice_detail.substitutions",
            "a mapping of pair name to slice count (an integer >= 0)",
            subs,
        )


def _check_decision(name: str, data: Any) -> None:
    """The shape of one stored decision (what the launcher and predictor read of it)."""
    where = f"decisions.{name}"
    _check_decision_fields(where, data)
    _check_candidates(where, data["candidates"])
    detail = data.get("choice_detail", {})
    _expect(isinstance(detail, dict), f"{where}.choice_detail", "a mapping", detail)
    _check_choice_detail(name, where, detail)


@dataclass
class Candidate:
    name: str
    predicted_ms: float | None  # None when infeasible
    feasible: bool
    detail: dict[str, Any] = field(default_factory=dict)  # policy-specific: placement, memory, breakdown


@dataclass
class Decision:
    policy: str
    choice: str
    predicted_ms: float
    candidates: list[Candidate]  # ranked, fastest first, infeasible last
    choice_detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Decision":
        return cls(
            policy=data["policy"],
            choice=data["choice"],
            predicted_ms=data["predicted_ms"],
            candidates=[Candidate(**c) for c in data["candidates"]],
            choice_detail=data.get("choice_detail", {}),
        )


@dataclass
class Plan:
    job: dict[str, Any]
    hardware_id: str
    model_version: str | None
    predicted_iteration_ms: float
    decisions: dict[str, Decision]
    notes: list[str] = field(default_factory=list)
    # where the ranks run: each rank's node index, the Ray node ids behind them and the node
    # types priced (`probes.vocabulary.placement`); empty in plans from before placements were recorded
    placement: dict[str, Any] = field(default_factory=dict)

    @property
    def rank_placement(self) -> RankPlacement:
        return RankPlacement.from_dict(self.placement, int(self.job.get("world_size", 1)))

    @property
    def table_to_rank(self) -> list[int]:
        return list(self.decisions["sharding"].choice_detail["table_to_rank"])

    @property
    def layout(self) -> dict[str, Any]:
        """The parallelism decision's layout: the `TransformerSpec` the job runs as (a dict)."""
        return dict(self.decisions["parallelism"].choice_detail["layout"])

    @property
    def chunk_schedule(self) -> dict[str, Any] | None:
        """The chunking decision's per-chunk schedule, to run the gradient all-reduce with."""
        chunking = self.decisions.get("chunking")
        return chunking.choice_detail["chunk_schedule"] if chunking else None

    @property
    def substitutions(self) -> dict[str, int]:
        """The substitution decision's chosen pairs: pair name -> slice count (none: {})."""
        substitution = self.decisions.get("substitution")
        return dict(substitution.choice_detail.get("substitutions", {})) if substitution else {}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """A stored plan, its shape checked: `PlanError` names the first field that is wrong."""
        _expect(
            isinstance(data, dict),
            "(top level)",
            "a plan object {job, hardware_id, predicted_iteration_ms, "
            "decisions, ...} as written by orchestrator.cli.plan or orchestrator.autotune",
            data,
        )
        for key in ("job", "hardware_id", "predicted_iteration_ms", "decisions"):
            _require(data, key, "")
        _expect(isinstance(data["job"], dict), "job", "the job mapping the plan was made for", data["job"])
        _expect(isinstance(data["hardware_id"], str), "hardware_id", "a string", data["hardware_id"])
        _expect(
            _is_number(data["predicted_iteration_ms"]) and data["predicted_iteration_ms"] >= 0,
            "predicted_iteration_ms",
            "a finite number >= 0",
            data["predicted_iteration_ms"],
        )
        mv = data.get("model_version")
        _expect(mv is None or isinstance(mv, (str, int)), "model_version", "a string or null", mv)
        _expect(
            isinstance(data["decisions"], dict), "decisions", "a mapping of policy name to decision", data["decisions"]
        )
        for name, decision in data["decisions"].items():
            _check_decision(str(name), decision)
        _expect(isinstance(data.get("notes", []), list), "notes", "a list", data.get("notes"))
        _expect(
            isinstance(data.get("placement", {}), dict), "placement", "a mapping {nodes, ...}", data.get("placement")
        )
        tables = data["job"].get("tables")
        sharding = data["decisions"].get("sharding")
        if isinstance(tables, list) and sharding is not None:
            t2r = sharding.get("choice_detail", {})["table_to_rank"]
            _expect(
                len(t2r) == len(tables),
                "decisions.sharding.choice_detail.table_to_rank",
                f"one entry per table of the plan's job ({len(tables)})",
                len(t2r),
            )
        return cls(
            job=data["job"],
            hardware_id=data["hardware_id"],
            model_version=data.get("model_version"),
            predicted_iteration_ms=data["predicted_iteration_ms"],
            decisions={k: Decision.from_dict(v) for k, v in data["decisions"].items()},
            notes=data.get("notes", []),
            placement=data.get("placement", {}),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """A plan file; problems with the file name the option it came from (`--plan`), with
        its content the field, both prefixed with the file."""
        path = Path(path)
        if not path.exists():
            raise PlanError(f"{path}: plan file not found")
        if not path.is_file():
            raise PlanError(f"{path}: expected a plan JSON file, got a directory or other non-file")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanError(
                f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); expected plan JSON"
            ) from None
        except OSError as exc:
            raise PlanError(f"{path}: cannot read the plan file: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise PlanError(f"{path}: not valid JSON: {exc}") from None
        try:
            return cls.from_dict(data)
        except PlanError as exc:
            raise PlanError(f"{path}: {exc}", exc.field) from None

    def check_job(self, job: Any) -> None:
        """That this plan can run `job`: a DLRM `JobSpec` made for the same tables and world
        size, every table's entry a valid sharding of it; a `TransformerJob` with the same model
        and a layout of it; else `PlanError` naming the field."""
        from probes.vocabulary.table_shards import ShardingPlanError, table_shards

        if job.workload == "transformer":
            self._check_transformer_job(job)
            return

        if "sharding" not in self.decisions:
            raise PlanError(
                "decisions.sharding: required for a DLRM plan (the table placement) and missing", "decisions.sharding"
            )
        field = "decisions.sharding.choice_detail.table_to_rank"
        names = [t.get("name") for t in self.job.get("tables", []) if isinstance(t, dict)]
        if names and names != [t.name for t in job.tables]:
            raise PlanError(
                f"job.tables: the plan was made for tables {names}, the job has {[t.name for t in job.tables]}",
                "job.tables",
            )
        if self.job.get("world_size") not in (None, job.world_size):
            raise PlanError(
                f"job.world_size: the plan was made for world_size {self.job['world_size']}, the job has "
                f"{job.world_size}",
                "job.world_size",
            )
        try:
            table_shards(job, self.table_to_rank)
        except ShardingPlanError as exc:
            raise PlanError(f"{field}: {exc}", field) from None
        if self.placement:
            try:
                RankPlacement.from_dict(self.placement, job.world_size)
            except PlacementError as exc:
                raise PlanError(str(exc), "placement") from None

    def _check_transformer_job(self, job: Any) -> None:
        from probes.vocabulary.transformer_spec import TransformerSpec, TransformerSpecError

        if "parallelism" not in self.decisions:
            raise PlanError(
                "decisions.parallelism: required for a transformer plan (the layout) and missing",
                "decisions.parallelism",
            )
        wanted = job.to_dict()
        for key in ("world_size", "layers", "hidden", "heads", "seq_len", "global_batch", "vocab_size", "dtype"):
            if self.job.get(key) != wanted[key]:
                raise PlanError(
                    f"job.{key}: the plan was made for {key} {self.job.get(key)!r}, the job has {wanted[key]!r}",
                    f"job.{key}",
                )
        try:
            TransformerSpec.from_dict(self.layout)
        except (TransformerSpecError, TypeError) as exc:
            raise PlanError(f"decisions.parallelism.choice_detail.layout: {exc}", "decisions.parallelism") from None

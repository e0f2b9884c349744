"""`Decision` and `Plan`: what was chosen, and every alternative with its predicted time."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from probes.files import atomic_write_text
from probes.placement import RankPlacement


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
            policy=data["policy"], choice=data["choice"], predicted_ms=data["predicted_ms"],
            candidates=[Candidate(**c) for c in data["candidates"]], choice_detail=data.get("choice_detail", {}),
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
    # types priced (`probes.placement`); empty in plans from before placements were recorded
    placement: dict[str, Any] = field(default_factory=dict)

    @property
    def rank_placement(self) -> RankPlacement:
        return RankPlacement.from_dict(self.placement, int(self.job.get("world_size", 1)))

    @property
    def table_to_rank(self) -> list[int]:
        return list(self.decisions["sharding"].choice_detail["table_to_rank"])

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
        return cls(
            job=data["job"], hardware_id=data["hardware_id"], model_version=data.get("model_version"),
            predicted_iteration_ms=data["predicted_iteration_ms"],
            decisions={k: Decision.from_dict(v) for k, v in data["decisions"].items()},
            notes=data.get("notes", []), placement=data.get("placement", {}),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        return cls.from_dict(json.loads(Path(path).read_text()))

"""The job spec: what the user wants to train, validated with errors that name the field.

Schema (YAML or an equivalent dict), DLRM:

    name: dlrm_small                # optional label (default "job")
    workload: dlrm                  # required; allowed: dlrm
    world_size: 2                   # ranks (devices), >= 1
    batch_size: 256                 # samples per rank per iteration
    iterations: 20                  # optional, timed iterations when launched (default 20)
    warmup_iterations: 5            # optional (default 5)
    seed: 0                         # optional
    dense:
      num_dense_features: 13        # dense inputs per sample
      bottom_mlp: [64, 32]          # widths of the bottom MLP layers
      top_mlp: [64, 1]              # widths of the top MLP layers; the last must be 1 (the logit)
    tables:                         # at least one
      - name: t0                    # unique
        num_embeddings: 100000      # rows
        embedding_dim: 32           # columns
        pooling_factor: 8           # lookups per sample (bag size)
        distribution: uniform       # or {zipf: 1.1}, or {profile: power1.1} (probes/data/reuse_profile.json)
    memory_cap_gb: 8                # optional per-rank cap for embedding tables

Interaction is concatenation: the top MLP reads the bottom MLP output next to every pooled
embedding, so tables may have different dims.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.embedding import TableShape
from probes.indices import Distribution

WORKLOADS = ("dlrm",)


class JobSpecError(ValueError):
    """Raised with every problem found, each as `path: what was expected, what was given`."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid job spec:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class TableSpec:
    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: int
    distribution: Distribution = Distribution()

    @property
    def shape(self) -> TableShape:
        return TableShape(self.num_embeddings, self.embedding_dim, self.pooling_factor, self.distribution)

    @property
    def bytes(self) -> int:
        return self.num_embeddings * self.embedding_dim * 4


@dataclass(frozen=True)
class DenseSpec:
    num_dense_features: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]


@dataclass(frozen=True)
class JobSpec:
    workload: str
    world_size: int
    batch_size: int
    dense: DenseSpec
    tables: tuple[TableSpec, ...]
    iterations: int = 20
    warmup_iterations: int = 5
    seed: int = 0
    memory_cap_gb: float | None = None
    name: str = "job"
    # Optional: the network the job runs on, for planning its gradient all-reduce's chunks:
    # {"topology": preset name or "calibrated"} or {"dims": [...]}, optional "collective_mb".
    # Checked for shape here; predictors.network checks the dimensions themselves.
    network: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: Any) -> "JobSpec":
        return _Validator().job(data)

    def dense_layers(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of every dense linear layer, bottom then top MLP."""
        layers, prev = [], self.dense.num_dense_features
        for w in self.dense.bottom_mlp:
            layers.append((prev, w))
            prev = w
        prev = self.dense.bottom_mlp[-1] + sum(t.embedding_dim for t in self.tables)
        for w in self.dense.top_mlp:
            layers.append((prev, w))
            prev = w
        return layers

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload": self.workload,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "iterations": self.iterations,
            "warmup_iterations": self.warmup_iterations,
            "seed": self.seed,
            "memory_cap_gb": self.memory_cap_gb,
            **({"network": self.network} if self.network is not None else {}),
            "dense": {
                "num_dense_features": self.dense.num_dense_features,
                "bottom_mlp": list(self.dense.bottom_mlp),
                "top_mlp": list(self.dense.top_mlp),
            },
            "tables": [
                {
                    "name": t.name,
                    "num_embeddings": t.num_embeddings,
                    "embedding_dim": t.embedding_dim,
                    "pooling_factor": t.pooling_factor,
                    "distribution": t.distribution.to_json(),
                }
                for t in self.tables
            ],
        }


class _Validator:
    """Collects every problem instead of stopping at the first, so one edit fixes a file."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, expected: str, got: Any) -> None:
        self.problems.append(f"{path}: expected {expected}, got {got!r}")

    def int_field(self, data: dict, key: str, path: str, minimum: int = 1, default: Any = ...) -> int:
        if key not in data:
            if default is ...:
                self.problems.append(f"{path}{key}: required field is missing (an integer >= {minimum})")
                return minimum
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(f"{path}{key}", f"an integer >= {minimum}", value)
            return minimum
        return value

    def int_list(self, data: dict, key: str, path: str) -> tuple[int, ...]:
        value = data.get(key)
        if not isinstance(value, list) or not value:
            self.fail(f"{path}{key}", "a non-empty list of positive integers", value)
            return (1,)
        out = []
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                self.fail(f"{path}{key}[{i}]", "a positive integer", v)
                v = 1
            out.append(v)
        return tuple(out)

    def job(self, data: Any) -> JobSpec:
        if not isinstance(data, dict):
            raise JobSpecError([f"(top level): expected a mapping of fields, got {type(data).__name__}"])
        known = {
            "workload", "world_size", "batch_size", "iterations", "warmup_iterations",
            "seed", "dense", "tables", "memory_cap_gb", "name", "network",
        }
        for key in data:
            if key not in known:
                self.problems.append(f"{key}: unknown field; allowed fields are {sorted(known)}")
        workload = data.get("workload")
        if workload not in WORKLOADS:
            self.fail("workload", f"one of {list(WORKLOADS)}", workload)
        world = self.int_field(data, "world_size", "")
        batch = self.int_field(data, "batch_size", "")
        iterations = self.int_field(data, "iterations", "", default=20)
        warmup = self.int_field(data, "warmup_iterations", "", minimum=0, default=5)
        seed = self.int_field(data, "seed", "", minimum=0, default=0)
        name = data.get("name", "job")
        if not isinstance(name, str) or not name:
            self.fail("name", "a non-empty string", name)
            name = "job"
        cap = data.get("memory_cap_gb")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            self.fail("memory_cap_gb", "a positive number of GiB", cap)
            cap = None
        dense = self.dense(data.get("dense"))
        tables = self.tables(data.get("tables"))
        network = self.network(data["network"]) if data.get("network") is not None else None
        if self.problems:
            raise JobSpecError(self.problems)
        return JobSpec(
            workload=workload, world_size=world, batch_size=batch, dense=dense, tables=tables,
            iterations=iterations, warmup_iterations=warmup, seed=seed,
            memory_cap_gb=float(cap) if cap is not None else None, name=name, network=network, raw=dict(data),
        )

    def network(self, data: Any) -> dict[str, Any] | None:
        allowed = ("topology", "dims", "collective_mb")
        if not isinstance(data, dict):
            self.fail("network", "a mapping with topology (a preset name or 'calibrated') or dims", data)
            return None
        for key in data:
            if key not in allowed:
                self.problems.append(f"network.{key}: unknown field; allowed: {', '.join(allowed)}")
        if ("topology" in data) == ("dims" in data):
            self.problems.append("network: give exactly one of topology (a preset name or 'calibrated') and dims")
        if "topology" in data and (not isinstance(data["topology"], str) or not data["topology"]):
            self.fail("network.topology", "a preset name or 'calibrated'", data["topology"])
        if "dims" in data and (not isinstance(data["dims"], list) or not data["dims"]
                               or not all(isinstance(d, dict) for d in data["dims"])):
            self.fail("network.dims", "a non-empty list of {peers, bandwidth_gbps, latency_us, algorithm}", data["dims"])
        mb = data.get("collective_mb")
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb <= 0):
            self.fail("network.collective_mb", "a positive number of MiB", mb)
        return dict(data)

    def dense(self, data: Any) -> DenseSpec:
        if not isinstance(data, dict):
            self.fail("dense", "a mapping with num_dense_features, bottom_mlp, top_mlp", data)
            return DenseSpec(1, (1,), (1,))
        for key in data:
            if key not in ("num_dense_features", "bottom_mlp", "top_mlp"):
                self.problems.append(f"dense.{key}: unknown field; allowed: num_dense_features, bottom_mlp, top_mlp")
        spec = DenseSpec(
            self.int_field(data, "num_dense_features", "dense."),
            self.int_list(data, "bottom_mlp", "dense."),
            self.int_list(data, "top_mlp", "dense."),
        )
        if spec.top_mlp[-1] != 1:
            self.fail("dense.top_mlp[-1]", "1 (the click logit)", spec.top_mlp[-1])
        return spec

    def tables(self, data: Any) -> tuple[TableSpec, ...]:
        if not isinstance(data, list) or not data:
            self.fail("tables", "a non-empty list of tables", data)
            return ()
        out, names = [], set()
        for i, t in enumerate(data):
            path = f"tables[{i}]."
            if not isinstance(t, dict):
                self.fail(f"tables[{i}]", "a mapping {name, num_embeddings, embedding_dim, pooling_factor, distribution}", t)
                continue
            allowed = {"name", "num_embeddings", "embedding_dim", "pooling_factor", "distribution"}
            for key in t:
                if key not in allowed:
                    self.problems.append(f"{path}{key}: unknown field; allowed: {sorted(allowed)}")
            name = t.get("name")
            if not isinstance(name, str) or not name:
                self.fail(f"{path}name", "a non-empty string", name)
                name = f"table{i}"
            elif name in names:
                self.fail(f"{path}name", "a name not used by another table", name)
            names.add(name)
            dist_value = t.get("distribution", "uniform")
            try:
                dist = Distribution.parse(dist_value)
                if dist.kind == "zipf" and not dist.s > 0:
                    raise ValueError
            except (ValueError, TypeError, KeyError):
                from probes.reuse_profile import load_profile

                self.fail(f"{path}distribution",
                          f"'uniform', {{zipf: s}} with s > 0, or {{profile: name}} with name in {load_profile().names}",
                          dist_value)
                dist = Distribution()
            out.append(
                TableSpec(
                    name,
                    self.int_field(t, "num_embeddings", path),
                    self.int_field(t, "embedding_dim", path),
                    self.int_field(t, "pooling_factor", path),
                    dist,
                )
            )
        return tuple(out)

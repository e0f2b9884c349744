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

Sizes have upper bounds (`LIMITS`): not what a cluster can hold (the planner refuses a job
larger than the cluster, or tables that fit no rank, with the field named), but what no job
this planner serves needs, so a typo such as `world_size: 100000` is refused at once instead
of running the planner, the simulator or a calibration until it is killed:

    world_size          1..65536    ranks; the largest GPU clusters built have tens of thousands
                                    of devices, and the simulator builds a graph per rank
    batch_size          1..2^20     samples per rank
    iterations          1..100000   timed iterations of one launch (warmup_iterations 0..10000)
    seed                0..2^32-1
    tables              1..max(4096, 32 x world_size)   (production DLRMs: hundreds to a
                                    thousand or so; the calibration's production-shaped
                                    random tasks: about 13 per rank)
    num_embeddings      1..2^34     rows of one table (>= 64 GiB at one float32 column)
    embedding_dim       1..8192     columns (column-wise sharding splits wide tables)
    pooling_factor      1..16384    lookups per sample; also batch_size x world_size x
                                    pooling_factor <= 2^30 ids per table and iteration (the
                                    planner samples one iteration's ids of every table it prices:
                                    8 GiB of them at the bound)
    num_dense_features, MLP widths  1..65536, at most 64 layers per MLP
    memory_cap_gb, network numbers  finite (no .nan / .inf), positive
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from probes.vocabulary.indices import Distribution

WORKLOADS = ("dlrm",)

MAX_WORLD_SIZE = 65536
MAX_ITERATIONS = 100_000
# (minimum, maximum, why the maximum) of every bounded integer field; see the module docstring.
LIMITS: dict[str, tuple[int, int, str]] = {
    "world_size": (1, MAX_WORLD_SIZE, "ranks; no cluster this planner serves is larger"),
    "batch_size": (1, 2**20, "samples per rank"),
    "iterations": (1, MAX_ITERATIONS, "timed iterations of one launch"),
    "warmup_iterations": (0, 10_000, "warm-up iterations of one launch"),
    "seed": (0, 2**32 - 1, "a 32-bit seed"),
    "tables": (1, 4096, "tables in one job, or 32 per rank when that is more"),
    "num_embeddings": (1, 2**34, "rows of one table"),
    "embedding_dim": (1, 8192, "columns of one table"),
    "pooling_factor": (1, 16384, "lookups per sample"),
    "num_dense_features": (1, 65536, "dense inputs"),
    "mlp_width": (1, 65536, "units of one layer"),
    "mlp_layers": (1, 64, "layers of one MLP"),
}
# ids of one table in one iteration (batch_size x world_size x pooling_factor): the planner
# draws them to price the table's lookups
MAX_LOOKUPS_PER_TABLE = 2**30
TABLES_PER_RANK = 32
MAX_COLLECTIVE_MB = 2**20  # 1 TiB


@dataclass(frozen=True)
class TableShape:
    """One embedding table as a lookup sees it: rows, width, lookups per sample and how the
    looked-up rows are distributed."""

    num_embeddings: int
    embedding_dim: int
    pooling_factor: int
    distribution: Distribution = Distribution()


class JobSpecError(ValueError):
    """Raised with every problem found, each as `path: what was expected, what was given`."""

    def __init__(self, problems: list[str], fields: list[str] | None = None):
        self.problems = problems
        # the field of every problem (the text before its first ": ", unless given)
        self.fields = fields if fields is not None else [p.split(": ", 1)[0] for p in problems]
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
        self.world_size = 1

    def fail(self, path: str, expected: str, got: Any, allowed: str = "") -> None:
        self.problems.append(f"{path}: expected {expected}, got {got!r}" + (f"; allowed: {allowed}" if allowed else ""))

    def bounded_int(self, value: Any, path: str, limit: str) -> int | None:
        """`value` if an integer within LIMITS[limit], else None with the problem recorded."""
        minimum, maximum, why = LIMITS[limit]
        allowed = f"{minimum}..{maximum}"
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(path, f"an integer >= {minimum}", value, allowed)
            return None
        if value > maximum:
            self.fail(path, f"an integer <= {maximum} ({why})", value, allowed)
            return None
        return value

    def int_field(self, data: dict, key: str, path: str, limit: str | None = None, default: Any = ...) -> int:
        minimum, maximum, _ = LIMITS[limit or key]
        if key not in data:
            if default is ...:
                self.problems.append(f"{path}{key}: required field is missing (an integer >= {minimum}; "
                                     f"allowed: {minimum}..{maximum})")
                return minimum
            return default
        value = self.bounded_int(data[key], f"{path}{key}", limit or key)
        return minimum if value is None else value

    def number(self, value: Any, path: str, what: str, minimum: float = 0.0, allow_minimum: bool = False,
               maximum: float = math.inf) -> bool:
        """Whether `value` is a finite number above `minimum` (or equal, if allowed) and at most
        `maximum`; records the problem otherwise (YAML's .nan and .inf included)."""
        ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
              and (value >= minimum if allow_minimum else value > minimum) and value <= maximum)
        if not ok:
            allowed = f"a finite number {'>=' if allow_minimum else '>'} {minimum:g}"
            self.fail(path, what, value, allowed + (f" and <= {maximum:.0f}" if math.isfinite(maximum) else ""))
        return ok

    def int_list(self, data: dict, key: str, path: str) -> tuple[int, ...]:
        value = data.get(key)
        minimum, maximum, _ = LIMITS["mlp_layers"]
        if not isinstance(value, list) or not value:
            self.fail(f"{path}{key}", "a non-empty list of positive integers", value)
            return (1,)
        if len(value) > maximum:
            self.fail(f"{path}{key}", f"at most {maximum} layers", len(value),
                      f"{minimum}..{maximum} layers")
            return (1,)
        out = []
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                self.fail(f"{path}{key}[{i}]", "a positive integer", v, "{}..{}".format(*LIMITS["mlp_width"][:2]))
                v = 1
            elif self.bounded_int(v, f"{path}{key}[{i}]", "mlp_width") is None:
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
        world = self.world_size = self.int_field(data, "world_size", "")
        batch = self.int_field(data, "batch_size", "")
        iterations = self.int_field(data, "iterations", "", default=20)
        warmup = self.int_field(data, "warmup_iterations", "", default=5)
        seed = self.int_field(data, "seed", "", default=0)
        name = data.get("name", "job")
        if (not isinstance(name, str) or not name or len(name) > 128 or any(c in name for c in "/\\")
                or not name.isprintable()):
            # it names files (.autotune/plans/<name>-<hardware>.json) and MLflow runs
            self.fail("name", "a non-empty string usable in a file name", name,
                      "up to 128 printable characters, no / or \\")
            name = "job"
        cap = data.get("memory_cap_gb")
        if cap is not None and not self.number(cap, "memory_cap_gb", "a positive number of GiB"):
            cap = None
        dense = self.dense(data.get("dense"))
        tables = self.tables(data.get("tables"))
        if not self.problems:
            for i, t in enumerate(tables):
                lookups = batch * world * t.pooling_factor
                if lookups > MAX_LOOKUPS_PER_TABLE:
                    self.fail(f"tables[{i}].pooling_factor",
                              f"batch_size x world_size x pooling_factor <= {MAX_LOOKUPS_PER_TABLE} (2^30) ids of "
                              f"one table per iteration, which the planner samples; {batch} x {world} x "
                              f"{t.pooling_factor} = {lookups}", t.pooling_factor,
                              f"pooling_factor <= {MAX_LOOKUPS_PER_TABLE // (batch * world)} at this batch_size and "
                              f"world_size" if batch * world <= MAX_LOOKUPS_PER_TABLE else
                              f"batch_size x world_size <= {MAX_LOOKUPS_PER_TABLE // t.pooling_factor}")
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
        elif "dims" in data:
            # the numbers here; unknown or missing keys and the algorithm: predictors.network
            for i, d in enumerate(data["dims"]):
                path = f"network.dims[{i}]."
                if "peers" in d:
                    self.bounded_int(d["peers"], f"{path}peers", "world_size")
                if "bandwidth_gbps" in d:
                    self.number(d["bandwidth_gbps"], f"{path}bandwidth_gbps", "a positive number of GB/s per NPU")
                if "latency_us" in d:
                    self.number(d["latency_us"], f"{path}latency_us", "a number of microseconds per step",
                                allow_minimum=True)
        mb = data.get("collective_mb")
        if mb is not None:
            self.number(mb, "network.collective_mb", "a positive number of MiB", maximum=MAX_COLLECTIVE_MB)
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
        if len(data) > max(LIMITS["tables"][1], TABLES_PER_RANK * self.world_size):
            most = max(LIMITS["tables"][1], TABLES_PER_RANK * self.world_size)
            self.fail("tables", f"at most max({LIMITS['tables'][1]}, {TABLES_PER_RANK} x world_size) = {most} tables",
                      len(data), f"1..{most} tables")
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
                if dist.kind == "zipf" and not (dist.s > 0 and math.isfinite(dist.s)):
                    raise ValueError
            except (ValueError, TypeError, KeyError):
                from probes.vocabulary.reuse_profile import load_profile

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

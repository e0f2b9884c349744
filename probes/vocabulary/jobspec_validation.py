"""Validation of a job spec (`probes.vocabulary.jobspec`, whose docstring gives the schema and
the bounds): every problem found, each naming its field, raised together as one `JobSpecError`.
"""

from __future__ import annotations

import math
from typing import Any

from probes.vocabulary.indices import Distribution
from probes.vocabulary.jobspec import (
    LIMITS,
    MAX_COLLECTIVE_MB,
    MAX_LOOKUPS_PER_TABLE,
    SCALAR_FIELDS,
    TABLES_PER_RANK,
    WORKLOADS,
    DenseSpec,
    JobSpec,
    JobSpecError,
    TableSpec,
)
from probes.vocabulary.sweep_job import SWEEP_LIMITS, SweepJob
from probes.vocabulary.transformer_job import TRANSFORMER_FIELDS, TRANSFORMER_LIMITS, TransformerJob
from probes.vocabulary.transformer_spec import DTYPES

# Every bounded integer field of any workload's job file.
_LIMITS = {**LIMITS, **TRANSFORMER_LIMITS, **SWEEP_LIMITS}


def parse_job(data: Any) -> JobSpec | TransformerJob | SweepJob:
    """A job file's mapping as the job of its `workload`: every problem found, each naming its
    field, raised together as one `JobSpecError`."""
    if isinstance(data, dict) and data.get("workload") == "transformer":
        return JobSpecValidator().transformer_job(data)
    if isinstance(data, dict) and data.get("workload") == "sweep":
        from probes.vocabulary.sweep_validation import SweepValidator  # it builds on JobSpecValidator

        return SweepValidator().sweep_job(data)
    return JobSpecValidator().job(data)


class JobSpecValidator:
    """Collects every problem instead of stopping at the first, so one edit fixes a file."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.world_size = 1

    def fail(self, path: str, expected: str, got: Any, allowed: str = "") -> None:
        self.problems.append(f"{path}: expected {expected}, got {got!r}" + (f"; allowed: {allowed}" if allowed else ""))

    def bounded_int(self, value: Any, path: str, limit: str) -> int | None:
        """`value` if an integer within LIMITS[limit], else None with the problem recorded."""
        minimum, maximum, why = _LIMITS[limit]
        allowed = f"{minimum}..{maximum}"
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(path, f"an integer >= {minimum}", value, allowed)
            return None
        if value > maximum:
            self.fail(path, f"an integer <= {maximum} ({why})", value, allowed)
            return None
        return value

    def int_field(self, data: dict, key: str, path: str, limit: str | None = None, default: Any = ...) -> int:
        minimum, maximum, _ = _LIMITS[limit or key]
        if key not in data:
            if default is ...:
                self.problems.append(
                    f"{path}{key}: required field is missing (an integer >= {minimum}; allowed: {minimum}..{maximum})"
                )
                return minimum
            return default
        value = self.bounded_int(data[key], f"{path}{key}", limit or key)
        return minimum if value is None else value

    def number(
        self,
        value: Any,
        path: str,
        what: str,
        minimum: float = 0.0,
        allow_minimum: bool = False,
        maximum: float = math.inf,
    ) -> bool:
        """Whether `value` is a finite number above `minimum` (or equal, if allowed) and at most
        `maximum`; records the problem otherwise (YAML's .nan and .inf included)."""
        ok = (
            not isinstance(value, bool)
            and isinstance(value, (int, float))
            and math.isfinite(value)
            and (value >= minimum if allow_minimum else value > minimum)
            and value <= maximum
        )
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
            self.fail(f"{path}{key}", f"at most {maximum} layers", len(value), f"{minimum}..{maximum} layers")
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

    def _unknown_fields(self, data: dict) -> None:
        """Records every top-level key that is not a job spec field."""
        known = {*SCALAR_FIELDS, "dense", "tables", "network"}
        for key in data:
            if key not in known:
                self.problems.append(f"{key}: unknown field; allowed fields are {sorted(known)}")

    def _job_name(self, name: Any) -> str:
        """`name` if usable in a file name, else "job" with the problem recorded."""
        if (
            not isinstance(name, str)
            or not name
            or len(name) > 128
            or any(c in name for c in "/\\")
            or not name.isprintable()
        ):
            # it names files (.autotune/plans/<name>-<hardware>.json) and MLflow runs
            self.fail(
                "name", "a non-empty string usable in a file name", name, "up to 128 printable characters, no / or \\"
            )
            return "job"
        return name

    def _memory_cap(self, cap: Any) -> Any:
        """`cap` (GiB) if absent or a positive number, else None with the problem recorded."""
        if cap is not None and not self.number(cap, "memory_cap_gb", "a positive number of GiB"):
            return None
        return cap

    def _check_lookups(self, tables: tuple[TableSpec, ...], batch: int, world: int) -> None:
        """Records every table whose ids per iteration exceed what the planner samples."""
        for i, t in enumerate(tables):
            lookups = batch * world * t.pooling_factor
            if lookups > MAX_LOOKUPS_PER_TABLE:
                self.fail(
                    f"tables[{i}].pooling_factor",
                    f"batch_size x world_size x pooling_factor <= {MAX_LOOKUPS_PER_TABLE} (2^30) ids of "
                    f"one table per iteration, which the planner samples; {batch} x {world} x "
                    f"{t.pooling_factor} = {lookups}",
                    t.pooling_factor,
                    f"pooling_factor <= {MAX_LOOKUPS_PER_TABLE // (batch * world)} at this batch_size and world_size"
                    if batch * world <= MAX_LOOKUPS_PER_TABLE
                    else f"batch_size x world_size <= {MAX_LOOKUPS_PER_TABLE // t.pooling_factor}",
                )

    def job(self, data: Any) -> JobSpec:
        if not isinstance(data, dict):
            raise JobSpecError([f"(top level): expected a mapping of fields, got {type(data).__name__}"])
        self._unknown_fields(data)
        workload = data.get("workload")
        if workload != "dlrm":
            self.fail("workload", f"one of {list(WORKLOADS)}", workload)
        world = self.world_size = self.int_field(data, "world_size", "")
        batch = self.int_field(data, "batch_size", "")
        run = self._run_fields(data)
        dense = self.dense(data.get("dense"))
        tables = self.tables(data.get("tables"))
        if not self.problems:
            self._check_lookups(tables, batch, world)
        network = self.network(data["network"]) if data.get("network") is not None else None
        if self.problems:
            raise JobSpecError(self.problems)
        return JobSpec(
            workload=str(workload),
            world_size=world,
            batch_size=batch,
            dense=dense,
            tables=tables,
            network=network,
            raw=dict(data),
            **run,
        )

    def _run_fields(self, data: dict) -> dict[str, Any]:
        """The fields every workload's job has beside its model: how it is launched and named."""
        run: dict[str, Any] = {
            "iterations": self.int_field(data, "iterations", "", default=20),
            "warmup_iterations": self.int_field(data, "warmup_iterations", "", default=5),
            "seed": self.int_field(data, "seed", "", default=0),
            "name": self._job_name(data.get("name", "job")),
        }
        cap = self._memory_cap(data.get("memory_cap_gb"))
        return {**run, "memory_cap_gb": float(cap) if cap is not None else None}

    def transformer_job(self, data: Any) -> TransformerJob:
        """A `workload: transformer` job (probes.vocabulary.transformer_job gives the schema)."""
        if not isinstance(data, dict):
            raise JobSpecError([f"(top level): expected a mapping of fields, got {type(data).__name__}"])
        for key in data:
            if key not in TRANSFORMER_FIELDS:
                self.problems.append(f"{key}: unknown field; allowed fields are {sorted(TRANSFORMER_FIELDS)}")
        if data.get("workload") != "transformer":
            self.fail("workload", f"one of {list(WORKLOADS)}", data.get("workload"))
        world = self.world_size = self.int_field(data, "world_size", "")
        sizes = {key: self.int_field(data, key, "") for key in ("layers", "hidden", "heads", "seq_len", "global_batch")}
        vocab = self.int_field(data, "vocab_size", "", default=0)
        if not self.problems and sizes["hidden"] % sizes["heads"]:
            self.fail("heads", f"a divisor of hidden={sizes['hidden']}", sizes["heads"])
        dtype = data.get("dtype", "float32")
        if dtype not in DTYPES:
            self.fail("dtype", "a training precision", dtype, ", ".join(DTYPES))
        dropout = data.get("dropout", 0.1)
        if not self.number(dropout, "dropout", "a dropout probability", minimum=0.0, allow_minimum=True, maximum=1.0):
            dropout = 0.1
        elif dropout >= 1.0:
            self.fail("dropout", "a dropout probability < 1", dropout, "0 <= p < 1")
        run = self._run_fields(data)
        network = self.network(data["network"]) if data.get("network") is not None else None
        if self.problems:
            raise JobSpecError(self.problems)
        return TransformerJob(
            world_size=world,
            layers=sizes["layers"],
            hidden=sizes["hidden"],
            heads=sizes["heads"],
            seq_len=sizes["seq_len"],
            global_batch=sizes["global_batch"],
            vocab_size=vocab,
            dtype=str(dtype),
            dropout=float(dropout),
            network=network,
            **run,
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
        if "dims" in data and (
            not isinstance(data["dims"], list) or not data["dims"] or not all(isinstance(d, dict) for d in data["dims"])
        ):
            self.fail(
                "network.dims", "a non-empty list of {peers, bandwidth_gbps, latency_us, algorithm}", data["dims"]
            )
        elif "dims" in data:
            # the numbers here; unknown or missing keys and the algorithm: predictors.network
            for i, d in enumerate(data["dims"]):
                path = f"network.dims[{i}]."
                if "peers" in d:
                    self.bounded_int(d["peers"], f"{path}peers", "world_size")
                if "bandwidth_gbps" in d:
                    self.number(d["bandwidth_gbps"], f"{path}bandwidth_gbps", "a positive number of GB/s per NPU")
                if "latency_us" in d:
                    self.number(
                        d["latency_us"], f"{path}latency_us", "a number of microseconds per step", allow_minimum=True
                    )
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
            self.fail(
                "tables",
                f"at most max({LIMITS['tables'][1]}, {TABLES_PER_RANK} x world_size) = {most} tables",
                len(data),
                f"1..{most} tables",
            )
            return ()
        out, names = [], set()
        for i, t in enumerate(data):
            path = f"tables[{i}]."
            if not isinstance(t, dict):
                self.fail(
                    f"tables[{i}]", "a mapping {name, num_embeddings, embedding_dim, pooling_factor, distribution}", t
                )
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

                self.fail(
                    f"{path}distribution",
                    f"'uniform', {{zipf: s}} with s > 0, or {{profile: name}} with name in {load_profile().names}",
                    dist_value,
                )
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

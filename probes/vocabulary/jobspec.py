"""The job spec: what the user wants to train, validated (`probes.vocabulary.jobspec_validation`)
with errors that name the field.

Schema (YAML or an equivalent dict), DLRM:

    name: dlrm_small                # optional label (default "job")
    workload: dlrm                  # required; allowed: dlrm, transformer (probes.vocabulary.transformer_job)
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

from dataclasses import asdict, dataclass, field
from typing import Any

from probes.vocabulary.indices import Distribution

# transformer jobs: probes.vocabulary.transformer_job; sweeps of fused trainings: .sweep_job
WORKLOADS = ("dlrm", "transformer", "sweep")
MODEL_WORKLOADS = ("dlrm", "transformer")  # one model trained on the cluster: what plan, run and predict take

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


# The fields of a job that are plain values, in the order a job file lists them.
SCALAR_FIELDS = (
    "name",
    "workload",
    "world_size",
    "batch_size",
    "iterations",
    "warmup_iterations",
    "seed",
    "memory_cap_gb",
)


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
        from probes.vocabulary.jobspec_validation import JobSpecValidator

        return JobSpecValidator().job(data)

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
        """The job as its file would give it (what `from_dict` reads back)."""
        out = {name: getattr(self, name) for name in SCALAR_FIELDS}
        if self.network is not None:
            out["network"] = self.network
        dense = self.dense
        out["dense"] = {
            "num_dense_features": dense.num_dense_features,
            "bottom_mlp": list(dense.bottom_mlp),
            "top_mlp": list(dense.top_mlp),
        }
        out["tables"] = [{**asdict(t), "distribution": t.distribution.to_json()} for t in self.tables]
        return out

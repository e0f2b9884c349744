"""Peak memory per rank of a DLRM training step, from the job and its plan (no run needed),
so plans that would not fit are flagged before they are launched; and the record every
memory model returns (the transformer's walk is predictors/transformer_memory.py).

Peak = weights + gradients + optimizer state + communication buffers + the activations
autograd saves for backward + the largest transient op output. fp32 throughout, as the
workloads train.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from predictors.dlrm_graph import FLOAT, all_to_all_shards_bytes
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.table_shards import DATA_PARALLEL, PlanEntry, row_wise_width, shard_bytes, table_shards

OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}  # extra fp32 values kept per parameter


@dataclass
class MemoryEstimate:
    """Bytes one rank holds at its peak, by what holds them."""

    weights: int
    gradients: int
    optimizer: int
    comm_buffers: int
    activations: int
    transient: int

    @property
    def peak(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.comm_buffers + self.activations + self.transient

    def fits(self, cap_bytes: float) -> bool:
        return self.peak <= cap_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peak": self.peak}


def dlrm_memory(spec: JobSpec, table_to_rank: Sequence[PlanEntry], rank: int, optimizer: str = "sgd") -> MemoryEstimate:
    """One rank of the sharded DLRM (`dlrm_memories`)."""
    return dlrm_memories(spec, table_to_rank, optimizer)[rank]


def dlrm_memories(spec: JobSpec, table_to_rank: Sequence[PlanEntry], optimizer: str = "sgd") -> list[MemoryEstimate]:
    """Every rank of the sharded DLRM: its table pieces (updated in place by the fused
    backward, so no table gradients, except data-parallel replicas whose dense gradients are
    all-reduced), the replicated MLPs, and the exchanged embeddings. The plan's pieces are
    listed once for all ranks: a 512-rank plan of a thousand row-wise tables has half a
    million of them."""
    W, B = spec.world_size, spec.batch_size
    shards = table_shards(spec, table_to_rank)
    tables = shard_bytes(shards, W)
    replicas, width = [0] * W, [0] * W
    for s in shards:
        if s.kind == DATA_PARALLEL:
            replicas[s.rank] += 4 * s.shape.num_embeddings * s.shape.embedding_dim
        else:
            width[s.rank] += s.shape.embedding_dim
    dense = sum(i * o + o for i, o in spec.dense_layers())
    emb_total = sum(t.embedding_dim for t in spec.tables)
    mlp_outputs = sum(o for _, o in spec.dense_layers())
    shared_activations = FLOAT * (
        B * emb_total  # exchanged embeddings
        + B * (spec.dense.num_dense_features + emb_total + spec.dense.bottom_mlp[-1])  # MLP inputs, concat
        + 2 * B * mlp_outputs  # linear outputs and relu outputs
    )
    exchanged = 2 * (all_to_all_shards_bytes(spec, shards) + FLOAT * B * W * row_wise_width(shards))
    transient = FLOAT * B * max([emb_total] + [o for _, o in spec.dense_layers()])
    return [
        MemoryEstimate(
            weights=tables[r] + FLOAT * dense,
            gradients=FLOAT * dense + replicas[r],
            optimizer=FLOAT * dense * OPTIMIZER_STATES[optimizer],
            comm_buffers=(exchanged + FLOAT * dense + replicas[r]) if W > 1 else 0,
            activations=FLOAT * W * B * width[r] + shared_activations,  # pooled lookups for the global batch
            transient=transient,
        )
        for r in range(W)
    ]

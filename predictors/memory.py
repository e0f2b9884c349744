"""Peak memory per rank of a training step, from the job and its layout (no run needed), so
plans that would not fit are flagged before they are launched.

Peak = weights + gradients + optimizer state + communication buffers + the activations
autograd saves for backward + the largest transient op output. The transformer's saved
activations are counted tensor by tensor as the block stack in probes/workloads/transformer.py
saves them (tests check the count against the bytes torch's saved-tensor hooks see); on CPU,
dropout keeps a float mask. fp32 throughout, as the workloads train.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from predictors.dlrm_graph import FLOAT, all_to_all_bytes
from predictors.transformer_graph import block_param_numel
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.table_shards import DATA_PARALLEL, PlanEntry, row_wise_width, shard_bytes, table_shards
from probes.vocabulary.transformer_spec import TransformerSpec

OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}  # extra fp32 values kept per parameter


@dataclass
class MemoryEstimate:
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


def transformer_saved_activation_bytes(spec: TransformerSpec) -> int:
    """Bytes autograd keeps between forward and backward on one rank (input and target included)."""
    T, H = spec.batch_size * spec.seq_len, spec.hidden
    local = H // spec.tensor_parallel
    scores = spec.batch_size * (spec.heads // spec.tensor_parallel) * spec.seq_len**2
    per_block = (
        2 * T
        + T * H  # layer_norm 1: mean/rstd; its output (QKV's input)
        + 3 * T * local  # QKV output (k and v are views of it)
        + T * local  # the scaled q
        + scores  # softmax output
        + T * local  # context (output projection's input)
        + T * H  # first residual (layer_norm 2's input)
        + 2 * T
        + T * H  # layer_norm 2: mean/rstd; its output
        + 4 * T * local  # fc1 output (gelu's input)
        + 4 * T * local  # gelu output (fc2's input)
        + T * H
    )  # second residual
    if spec.dropout > 0:
        per_block += 2 * scores + 2 * T * H  # attention after dropout; float masks (scores, two T*H)
    final = 2 * T + T * H + T * H  # final layer_norm stats and output; the loss target
    return FLOAT * (T * H + spec.layers * per_block + final)


def transformer_memory(spec: TransformerSpec, optimizer: str = "sgd") -> MemoryEstimate:
    params = block_param_numel(spec) * spec.layers + 2 * spec.hidden
    T, local = spec.batch_size * spec.seq_len, spec.hidden // spec.tensor_parallel
    scores = spec.batch_size * (spec.heads // spec.tensor_parallel) * spec.seq_len**2
    return MemoryEstimate(
        weights=FLOAT * params,
        gradients=FLOAT * params,
        optimizer=FLOAT * params * OPTIMIZER_STATES[optimizer],
        comm_buffers=FLOAT * params if spec.data_parallel > 1 else 0,  # DDP's flat bucket copies
        activations=transformer_saved_activation_bytes(spec),
        transient=FLOAT * max(scores, 4 * T * local, T * spec.hidden),  # the largest op output in flight
    )


def dlrm_memory(spec: JobSpec, table_to_rank: Sequence[PlanEntry], rank: int, optimizer: str = "sgd") -> MemoryEstimate:
    """One rank of the sharded DLRM: its table pieces (updated in place by the fused backward,
    so no table gradients, except data-parallel replicas whose dense gradients are
    all-reduced), the replicated MLPs, and the exchanged embeddings."""
    W, B = spec.world_size, spec.batch_size
    shards = table_shards(spec, table_to_rank)
    tables = shard_bytes(shards, W)[rank]
    replicas = sum(
        4 * s.shape.num_embeddings * s.shape.embedding_dim for s in shards if s.rank == rank and s.kind == DATA_PARALLEL
    )
    dense = sum(i * o + o for i, o in spec.dense_layers())
    width = sum(s.shape.embedding_dim for s in shards if s.rank == rank and s.kind != DATA_PARALLEL)
    emb_total = sum(t.embedding_dim for t in spec.tables)
    mlp_outputs = sum(o for _, o in spec.dense_layers())
    activations = FLOAT * (
        W * B * width  # pooled lookups for the global batch
        + B * emb_total  # exchanged embeddings
        + B * (spec.dense.num_dense_features + emb_total + spec.dense.bottom_mlp[-1])  # MLP inputs, concat
        + 2 * B * mlp_outputs
    )  # linear outputs and relu outputs
    exchanged = 2 * (all_to_all_bytes(spec, table_to_rank) + FLOAT * B * W * row_wise_width(shards))
    return MemoryEstimate(
        weights=tables + FLOAT * dense,
        gradients=FLOAT * dense + replicas,
        optimizer=FLOAT * dense * OPTIMIZER_STATES[optimizer],
        comm_buffers=(exchanged + FLOAT * dense + replicas) if W > 1 else 0,
        activations=activations,
        transient=FLOAT * B * max([emb_total] + [o for _, o in spec.dense_layers()]),
    )

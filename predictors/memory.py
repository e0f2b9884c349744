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
from predictors.transformer_graph import block_param_numel, stage_param_numel
from probes.vocabulary.jobspec import JobSpec
from probes.vocabulary.table_shards import DATA_PARALLEL, PlanEntry, row_wise_width, shard_bytes, table_shards
from probes.vocabulary.transformer_spec import GRADIENT_BUCKET_BYTES, TransformerSpec

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


def _block_saved_bytes(spec: TransformerSpec, T: int) -> int:
    """What autograd keeps of one block for a micro-batch of T tokens (without its input)."""
    H = spec.hidden
    local = H // spec.tensor_parallel
    scores = (T // spec.seq_len) * (spec.heads // spec.tensor_parallel) * spec.seq_len**2
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
        + T * H  # second residual
    )
    if spec.dropout > 0:
        per_block += 2 * scores + 2 * T * H  # attention after dropout; float masks (scores, two T*H)
    return FLOAT * per_block


def _data_bytes(spec: TransformerSpec, stage: int) -> int:
    """The local batch's inputs (first stage) and targets (last stage), held all step: token
    ids (int64) with a vocabulary, else float32 activations; micro-batches are views of them."""
    tokens = spec.batch_size * spec.seq_len
    each = 8 * tokens if spec.vocab_size else FLOAT * tokens * spec.hidden
    return each * ((stage == 0) + (stage == spec.pipeline_parallel - 1))


def _micro_batch_saved_bytes(spec: TransformerSpec, stage: int) -> int:
    """What autograd keeps of one micro-batch on stage `stage` between its forward and
    backward (the batch's data aside): every block's saved tensors, or under recomputation only
    each block's input; the stage's input where it is not the batch's data (activations
    received from the previous stage, or the embedding's output); the final layer norm and loss."""
    T, H = spec.micro_batch_size * spec.seq_len, spec.hidden
    layers = len(spec.stage_layers(stage))
    first, last = stage == 0, stage == spec.pipeline_parallel - 1
    if spec.recompute:
        # each checkpoint keeps its block's input; the last block's output is kept by the final
        # layer norm (or by the schedule, to send its gradient back)
        saved = FLOAT * T * H * layers
    else:
        saved = layers * _block_saved_bytes(spec, T)
    if not first or spec.vocab_size:  # the first block's input: received, or the embedding's output
        saved += FLOAT * T * H
    if last:
        saved += FLOAT * (2 * T + T * H)  # final layer_norm: mean/rstd; its output (the loss's or head's input)
        if spec.vocab_size:
            saved += FLOAT * (T * spec.vocab_size + 1)  # cross-entropy: log-softmax output, total weight
    return saved


def transformer_saved_activation_bytes(spec: TransformerSpec, stage: int = 0) -> int:
    """Bytes autograd keeps between forward and backward on one rank of `stage`, for one
    micro-batch in flight, input and target included."""
    return _data_bytes(spec, stage) + _micro_batch_saved_bytes(spec, stage)


def in_flight_micro_batches(spec: TransformerSpec, stage: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once: under 1F1B as many as the
    stages from it to the last (the warm-up forwards plus one), else one (gradient accumulation
    finishes a micro-batch's backward before the next forward)."""
    return min(spec.micro_batches, spec.pipeline_parallel - stage)


def transformer_stage_memory(spec: TransformerSpec, stage: int, optimizer: str = "sgd") -> MemoryEstimate:
    """One rank of pipeline stage `stage`: its parameters as the layout holds them (whole, or
    an FSDP shard plus the units gathered at once), gradients, optimizer state, communication
    buffers, the activations of the micro-batches in flight, and the largest transient."""
    P = stage_param_numel(spec, stage)
    block = block_param_numel(spec)
    T, H = spec.micro_batch_size * spec.seq_len, spec.hidden
    local = H // spec.tensor_parallel
    scores = spec.micro_batch_size * (spec.heads // spec.tensor_parallel) * spec.seq_len**2
    dp = spec.data_parallel
    sharded = spec.fsdp != "none" and dp > 1
    if sharded:
        shard = -(-P // dp)
        # full_shard: a block gathered for compute plus the next one prefetched; shard_grad_op
        # keeps every gathered block from its forward to its backward
        gathered = 2 * block if spec.fsdp == "full_shard" else P
        weights = FLOAT * (shard + gathered)
        # unsharded gradients: accumulated whole across micro-batches, else a block or two at a time
        gradients = FLOAT * (shard + (P if spec.micro_batches > 1 else 2 * block))
        optimizer_state = FLOAT * shard * OPTIMIZER_STATES[optimizer]
        comm = 0
    else:
        weights = gradients = FLOAT * P
        optimizer_state = FLOAT * P * OPTIMIZER_STATES[optimizer]
        if dp > 1 and spec.pipeline_parallel == 1:
            comm = FLOAT * P  # DDP's flat bucket copies
        elif dp > 1:
            comm = min(FLOAT * P, GRADIENT_BUCKET_BYTES)  # the pipeline's flat bucket, one at a time
        else:
            comm = 0
    if spec.pipeline_parallel > 1:
        comm += 2 * FLOAT * T * H  # the stage's receive buffers: activations and their gradient
    activations = _data_bytes(spec, stage) + in_flight_micro_batches(spec, stage) * _micro_batch_saved_bytes(
        spec, stage
    )
    # In flight beside what is saved: in the forward an op's input and output; in the backward
    # the residual stream's gradient and, at the widest op, the gradients of its output and its
    # input (the attention's two score-sized ones, the MLP's two 4H-wide ones, the LM head's).
    largest = [scores, 4 * T * local, T * H] + ([T * spec.vocab_size] if spec.vocab_size else [])
    transient = FLOAT * (T * H + 2 * max(largest))
    if spec.recompute:  # a block's activations, recomputed for its backward
        transient += _block_saved_bytes(spec, T)
    return MemoryEstimate(weights, gradients, optimizer_state, comm, activations, transient)


def transformer_memory(spec: TransformerSpec, optimizer: str = "sgd") -> MemoryEstimate:
    """The peak per rank: the pipeline stage that needs the most (every stage's ranks hold the
    same shard sizes)."""
    stages = [transformer_stage_memory(spec, s, optimizer) for s in range(spec.pipeline_parallel)]
    return max(stages, key=lambda m: m.peak)


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

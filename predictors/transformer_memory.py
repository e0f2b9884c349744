"""Peak memory per rank of a transformer layout's training step, found by walking the step
the way the reference workload (probes/workloads/transformer.py) runs it, so layouts that
would not fit are refused before anything is launched.

A sum of everything a step ever holds over-counts: gradients are freed by
`zero_grad(set_to_none=True)` and grow block by block in the first backward, a block's saved
activations are freed as its backward goes down it, FSDP gathers and frees blocks as they
are needed, and a recomputed block's activations exist only during its own backward. So
each rank's memory is taken at every point where it can peak (the end of a micro-batch's
forward, each op of each block's backward, the end of the step), in the order the stage runs
its micro-batches (1F1B, or gradient accumulation), and the peak is the largest. The saved
tensors are counted op by op as the block saves them (tests check their sum against the
bytes torch's saved-tensor hooks see); on CPU, dropout keeps a float mask. fp32 throughout,
as the workloads train.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from predictors.dlrm_graph import FLOAT
from predictors.memory import OPTIMIZER_STATES, MemoryEstimate
from predictors.transformer_graph import block_param_numel, one_f_one_b, stage_param_numel
from probes.vocabulary.transformer_spec import GRADIENT_BUCKET_BYTES, TransformerSpec


@dataclass(frozen=True)
class SavedOp:
    """One forward op as its backward sees it, in floats: what autograd keeps for it (freed
    once its backward has run), the gradients in flight while that backward runs (the
    gradient of its output and of its input) and its parameters (their gradients are made
    by that backward)."""

    saved: int
    gradients: int
    params: int = 0


def block_ops(spec: TransformerSpec, T: int) -> list[SavedOp]:
    """One block's ops in forward order for a micro-batch of T tokens (the block's input and
    output aside: the previous block or the stage keeps them)."""
    H = spec.hidden
    local = H // spec.tensor_parallel
    scores = (T // spec.seq_len) * (spec.heads // spec.tensor_parallel) * spec.seq_len**2
    dropout = spec.dropout > 0
    ops = [
        SavedOp(2 * T, 2 * T * H, 2 * H),  # layer_norm 1: mean/rstd
        SavedOp(T * H, 3 * T * local + T * H, 3 * local * (H + 1)),  # QKV: its input (layer_norm 1's output)
        SavedOp(4 * T * local, scores + 3 * T * local),  # q·kᵀ: the scaled q; k and v (views of QKV's output)
        SavedOp(scores, 2 * scores),  # softmax: its output
    ]
    if dropout:
        ops.append(SavedOp(scores, 2 * scores))  # attention dropout: its float mask
    ops += [
        SavedOp(scores if dropout else 0, scores + 2 * T * local),  # ·v: the attention after dropout
        SavedOp(T * local, T * H + T * local, local * H + H),  # output projection (its bias whole): the context
    ]
    if dropout:
        ops.append(SavedOp(T * H, 2 * T * H))  # its dropout mask
    ops += [
        SavedOp(T * H + 2 * T, 2 * T * H, 2 * H),  # layer_norm 2: the first residual; mean/rstd
        SavedOp(T * H, 4 * T * local + T * H, 4 * local * (H + 1)),  # fc1: its input
        SavedOp(4 * T * local, 8 * T * local),  # gelu: its input
        SavedOp(4 * T * local, T * H + 4 * T * local, 4 * local * H + H),  # fc2: its input
    ]
    if dropout:
        ops.append(SavedOp(T * H, 2 * T * H))  # its dropout mask
    return ops


def final_ops(spec: TransformerSpec, T: int) -> list[SavedOp]:
    """The last stage's ops after its blocks: the final layer norm, then the loss (MSE against
    the target) or the LM head and its cross-entropy."""
    H, V = spec.hidden, spec.vocab_size
    ops = [
        SavedOp(2 * T, 2 * T * H),
        SavedOp(T * H, (T * V if V else T * H) + T * H),
    ]  # ln_f; the loss's or head's input
    if V:
        ops.append(SavedOp(T * V + 1, 2 * T * V))  # log-softmax output, total weight; the logits' gradients
    return ops


def _block_saved(spec: TransformerSpec, T: int) -> int:
    """Floats one block keeps for a micro-batch between its forward and its backward: its ops'
    saved tensors (only its input, under recomputation) and its output."""
    return (0 if spec.recompute else sum(op.saved for op in block_ops(spec, T))) + T * spec.hidden


def _data_bytes(spec: TransformerSpec, stage: int) -> int:
    """The local batch's inputs (first stage) and targets (last stage), held all step: token
    ids (int64) with a vocabulary, else float32 activations; micro-batches are views of them."""
    tokens = spec.batch_size * spec.seq_len
    each = 8 * tokens if spec.vocab_size else FLOAT * tokens * spec.hidden
    return each * ((stage == 0) + (stage == spec.pipeline_parallel - 1))


def _stage_input(spec: TransformerSpec, stage: int, T: int) -> int:
    """Floats of the first block's input where it is not the batch's data: activations
    received from the previous stage, or the embedding's output."""
    return T * spec.hidden if stage > 0 or spec.vocab_size else 0


def _kept_logits(spec: TransformerSpec, T: int) -> int:
    """Floats of the logits a pipeline's last stage keeps until the micro-batch's backward
    (the schedule caches the stage's output); without a pipeline nothing holds them after
    the loss."""
    return T * spec.vocab_size if spec.pipeline_parallel > 1 else 0


def _micro_batch_saved(spec: TransformerSpec, stage: int) -> int:
    """Floats stage `stage` keeps of one micro-batch between its forward and its backward."""
    T = spec.micro_batch_size * spec.seq_len
    saved = _stage_input(spec, stage, T) + len(spec.stage_layers(stage)) * _block_saved(spec, T)
    if stage == spec.pipeline_parallel - 1:
        saved += sum(op.saved for op in final_ops(spec, T)) + _kept_logits(spec, T)
    return saved


def transformer_saved_activation_bytes(spec: TransformerSpec, stage: int = 0) -> int:
    """Bytes autograd keeps between forward and backward on one rank of `stage`, for one
    micro-batch in flight, input and target included."""
    return _data_bytes(spec, stage) + FLOAT * _micro_batch_saved(spec, stage)


@dataclass(frozen=True)
class _Stage:
    """What one rank of a stage holds, in floats, as the walk needs it."""

    params: int  # the stage's parameters, unsharded
    block: int  # one block's parameters
    blocks: int  # blocks on the stage
    shards: int  # FSDP's data-parallel degree (1: not sharded)
    accumulate_unsharded: bool  # FSDP without gradient sync on all but the last micro-batch
    head: int  # the final layer norm and LM head (last stage)

    @property
    def root(self) -> int:
        """Parameters outside the blocks (embedding, final layer norm, LM head)."""
        return self.params - self.blocks * self.block


class _Walk:
    """The points of one rank's step where its memory can peak, each as a MemoryEstimate."""

    def __init__(self, spec: TransformerSpec, stage: int, optimizer: str):
        self.spec, self.stage = spec, stage
        dp = spec.data_parallel
        sharded = spec.fsdp != "none" and dp > 1
        P = stage_param_numel(spec, stage)
        self.s = _Stage(
            params=P,
            block=block_param_numel(spec),
            blocks=len(spec.stage_layers(stage)),
            shards=dp if sharded else 1,
            accumulate_unsharded=sharded and spec.micro_batches > 1,
            head=(2 * spec.hidden + spec.vocab_size * spec.hidden) if stage == spec.pipeline_parallel - 1 else 0,
        )
        self.T = spec.micro_batch_size * spec.seq_len
        self.last = stage == spec.pipeline_parallel - 1
        shard = -(-P // self.s.shards)
        self.optimizer = FLOAT * shard * OPTIMIZER_STATES[optimizer]
        comm = 0
        if not sharded and dp > 1 and spec.pipeline_parallel == 1:
            comm = FLOAT * P  # DDP's buckets, allocated with the module
        # the pipeline's receive buffers, one per micro-batch, kept across steps: activations
        # (the stage's input) and their gradients
        self.received = self.T * spec.hidden if stage > 0 else 0
        comm += FLOAT * spec.micro_batches * (self.received + (0 if self.last else self.T * spec.hidden))
        self.comm = comm
        self.data = _data_bytes(spec, stage)
        self.micro = _micro_batch_saved(spec, stage)

    # -- parameters and gradients as the step goes ----------------------------------------
    def _weights(self, gathered_blocks: int, in_root: bool) -> int:
        """The parameters as held at a point `in_root` (inside the stack module's forward or
        backward, not the loss's ops after it) with `gathered_blocks` blocks gathered: whole,
        or FSDP's shard plus what it has gathered. The root unit (embedding, final norm, head)
        is gathered for the module's forward and again from the head's backward to the end;
        shard_grad_op keeps it gathered throughout."""
        s = self.s
        if s.shards == 1:
            return FLOAT * s.params
        root = s.root if in_root or self.spec.fsdp == "shard_grad_op" else 0
        return FLOAT * (-(-s.params // s.shards) + root + gathered_blocks * s.block)

    def _gathered(self, below: int | None) -> int:
        """Blocks FSDP holds gathered in the backward of the block with `below` blocks under
        it, or (None) in the loss's or the head's: full_shard gathers a block for its backward
        and prefetches the next one down; shard_grad_op keeps every block gathered from its
        forward until its own backward has run."""
        if self.s.shards == 1:
            return 0
        if self.spec.fsdp == "shard_grad_op":
            return self.s.blocks if below is None else below + 1
        return 1 if below is None else min(2, below + 1)

    def _gradients(self, blocks_done: int, partial: int, head_made: bool, accumulated: bool) -> int:
        """Gradients held once `blocks_done` blocks (from the top), `partial` parameters of
        the block in backward and (`head_made`) the final norm and head have made theirs (the
        embedding's comes last, at the step's end): none after
        zero_grad(set_to_none=True) until a backward makes them; every one once an earlier
        micro-batch's backward ran. FSDP reduce-scatters a block's gradient as its backward
        ends (its shard stays; the flat reduce-scatter input is kept until the next block's)
        and the root unit's at the end; without gradient sync it keeps them whole until the
        last micro-batch."""
        s = self.s
        root = s.head if head_made else 0
        if s.shards == 1 or s.accumulate_unsharded:
            if accumulated:  # the last micro-batch's reduce-scatter input beside them, under FSDP
                return FLOAT * (s.params + (s.block if s.shards > 1 else 0))
            return FLOAT * (root + blocks_done * s.block + partial)
        shard = -(-s.block // s.shards)
        return FLOAT * (root + blocks_done * shard + partial + (s.block if blocks_done else 0))

    def _point(
        self, gathered: int, in_root: bool, gradients: int, in_flight: int, transient: int, extra_comm: int = 0
    ) -> MemoryEstimate:
        """`in_flight`: floats of the saved activations held; `transient`: floats of the
        gradients and outputs in flight beside them."""
        return MemoryEstimate(
            weights=self._weights(gathered, in_root),
            gradients=gradients,
            optimizer=self.optimizer,
            comm_buffers=self.comm + extra_comm,
            activations=self.data + FLOAT * in_flight,
            transient=FLOAT * transient,
        )

    # -- the points ------------------------------------------------------------------------
    def backward(self, others: int, backwards: int) -> list[MemoryEstimate]:
        """A micro-batch's backward, `others` micro-batches held beside it and `backwards`
        run before it this step, from the loss (or the received gradient) down to the first
        block."""
        accumulated = backwards > 0
        spec, s, T, H = self.spec, self.s, self.T, self.spec.hidden
        held = others * self.micro
        block_saved = _block_saved(spec, T)
        below_blocks = _stage_input(spec, self.stage, T)
        # a received input's gradient stays on it (a leaf) until the next step clears it
        input_grads = FLOAT * backwards * self.received
        points = []
        if self.last:
            ops = final_ops(spec, T)
            kept = list(accumulate(op.saved for op in ops))  # saved by the ops up to each
            for k in range(len(ops) - 1, -1, -1):
                saved = below_blocks + s.blocks * block_saved + kept[k] + _kept_logits(spec, T)
                in_root = k == 0 or (k == 1 and spec.vocab_size > 0)  # the final norm or the head, not the loss
                grads = self._gradients(0, 0, in_root, accumulated)
                gathered = self._gathered(None) if in_root or spec.fsdp != "full_shard" else 0
                points.append(self._point(gathered, in_root, grads, held + saved, ops[k].gradients, input_grads))
        ops = block_ops(spec, T)
        kept = list(accumulate(op.saved for op in ops))  # recomputed for its backward, under recomputation
        made = list(accumulate((op.params for op in reversed(ops))))[::-1]  # its gradients, from the top to each
        for done in range(s.blocks):
            below = s.blocks - done - 1
            under = below_blocks + below * block_saved + T * H  # blocks under it, and its own output
            for k in range(len(ops) - 1, -1, -1):
                own = kept[k]
                grads = self._gradients(done, made[k], self.last, accumulated)
                # the residual stream's gradient beside the op's own
                points.append(
                    self._point(
                        self._gathered(below), True, grads, held + under + own, T * H + ops[k].gradients, input_grads
                    )
                )
        return points

    def forward_end(self, others: int, accumulated: bool) -> MemoryEstimate:
        """A micro-batch's forward finished: its saved tensors, the loss's output in flight on
        the last stage (the logits beside their log-softmax), every block gathered under
        shard_grad_op."""
        T, V = self.T, self.spec.vocab_size
        grads = self._gradients(self.s.blocks, 0, True, True) if accumulated else 0
        out = (T * V if V else T * self.spec.hidden) if self.last else 0  # else the output is among its saved
        gathered = self._gathered(None) if self.spec.fsdp != "full_shard" else 0  # full_shard resharded them all
        return self._point(gathered, False, grads, (others + 1) * self.micro, out)

    def step_end(self) -> MemoryEstimate:
        """Every gradient made, no activations: a pipeline's data-parallel average (one flat
        bucket at a time), or the embedding's gradient at the end of the first stage."""
        s, bucket = self.s, 0
        if s.shards == 1 and self.spec.data_parallel > 1 and self.spec.pipeline_parallel > 1:
            bucket = min(FLOAT * s.params, GRADIENT_BUCKET_BYTES)
        bucket += FLOAT * self.spec.micro_batches * self.received  # the received inputs' gradients
        if s.shards > 1 and not s.accumulate_unsharded:
            gradients = FLOAT * (-(-s.params // s.shards) + s.root)  # the blocks' reduce-scattered; the root's whole
        else:
            gradients = FLOAT * s.params + (FLOAT * s.block if s.shards > 1 else 0)
        return self._point(0, True, gradients, 0, self.T * self.spec.hidden, bucket)


def transformer_stage_memory(spec: TransformerSpec, stage: int, optimizer: str = "sgd") -> MemoryEstimate:
    """One rank of pipeline stage `stage` at its peak: the stage's micro-batches in the order
    it runs them (1F1B, or one after another accumulating gradients), each point where its
    memory can peak priced with what it holds there."""
    walk = _Walk(spec, stage, optimizer)
    points, in_flight, backwards = [walk.step_end()], 0, 0
    for kind, _ in one_f_one_b(spec.pipeline_parallel, stage, spec.micro_batches):
        if kind == "F":
            points.append(walk.forward_end(in_flight, backwards > 0))
            in_flight += 1
        else:
            points += walk.backward(in_flight - 1, backwards)
            in_flight -= 1
            backwards += 1
    return max(points, key=lambda m: m.peak)


def transformer_memory(spec: TransformerSpec, optimizer: str = "sgd") -> MemoryEstimate:
    """The peak per rank: the pipeline stage that needs the most (every stage's ranks hold the
    same shard sizes)."""
    stages = [transformer_stage_memory(spec, s, optimizer) for s in range(spec.pipeline_parallel)]
    return max(stages, key=lambda m: m.peak)

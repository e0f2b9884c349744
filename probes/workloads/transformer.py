"""A GPT-style block stack trained under any layout the parallelism policy may choose: data,
tensor and pipeline parallel, micro-batches, activation recomputation, sharded data parallel
(FSDP). The real job the transformer execution-graph builder (predictors/transformer_graph.py)
mirrors op for op; one block is probes/workloads/transformer_block.py.

Pre-LN blocks: layer_norm → QKV projection → scaled q·kᵀ → softmax → dropout → ·v → output
projection → dropout → residual; layer_norm → fc1 → gelu → fc2 → dropout → residual. Tensor
parallelism splits heads and the fc1 width Megatron-style: QKV and fc1 are column-parallel
(the input's gradient is all-reduced over the TP group in backward), the output projection
and fc2 are row-parallel (their outputs are all-reduced in forward, bias added after). Data
parallelism all-reduces gradients with DDP over the ranks of a stage holding the same TP shard,
or shards parameters, gradients and optimizer state with FSDP (`fully_shard`, one unit per
block). Pipeline parallelism gives each stage a contiguous run of blocks and runs the
micro-batches through `torch.distributed.pipelining`'s 1F1B schedule; without it, micro-batches
accumulate gradients (DDP / FSDP synchronise on the last one only). Recomputation wraps each
block in a non-reentrant `torch.utils.checkpoint`, so its forward (TP all-reduces included)
runs again in its backward.

Every layout starts from the same model and sees the same data: each block's full weights are
drawn from a generator seeded by (seed, layer) and sliced to the rank's TP shard, and each
sequence of the global batch from (seed, sequence index), so a layout trains like the
unpartitioned model (tests/test_transformer_layouts.py). With `vocab_size` the input is token
ids through an embedding and the loss a cross-entropy over an LM head (both replicated across
TP ranks); without, the input is a random activation batch and the loss a mean-squared error
against a random target: the block stack is what is timed, not a tokenizer.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from probes.comm import destroy_groups
from probes.vocabulary.transformer_spec import CPU_DTYPES, GRADIENT_BUCKET_BYTES, TransformerSpec
from probes.workloads.timed_steps import RunResult, run_timed_steps
from probes.workloads.transformer_block import Block, full_block_weights, uniform_init


class BlockStack(nn.Module):
    def __init__(
        self,
        spec: TransformerSpec,
        tp_group: Any,
        overlap_slices: dict[str, int] | None = None,
        stage: int = 0,
        tp_rank: int = 0,
    ):
        """Pipeline stage `stage`'s blocks (all of them without pipelining): the token
        embedding on the first stage and the final layer norm (+ LM head) on the last, where
        the spec has a vocabulary. `overlap_slices`: "b{layer}.{out|fc2}" -> slices, as the
        substitution decision names pairs."""
        super().__init__()
        self.spec = spec
        self.layers = spec.stage_layers(stage)
        self.first, self.last = stage == 0, stage == spec.pipeline_parallel - 1
        per_block = {
            layer: {
                name.split(".", 1)[1]: k
                for name, k in (overlap_slices or {}).items()
                if name.split(".", 1)[0] == f"b{layer}"
            }
            for layer in self.layers
        }
        self.blocks = nn.ModuleList(Block(spec, tp_group, per_block[layer]) for layer in self.layers)
        for layer, block in zip(self.layers, self.blocks):
            block.load_full(full_block_weights(spec, layer), tp_rank)
        g = torch.Generator().manual_seed(spec.seed * 1_000_003 - 1)  # embedding and head: one draw
        embedding = torch.randn((spec.vocab_size, spec.hidden), generator=g) if spec.vocab_size else None
        head = uniform_init(g, (spec.vocab_size, spec.hidden), spec.hidden) if spec.vocab_size else None
        if self.first and embedding is not None:
            self.embedding = nn.Embedding.from_pretrained(embedding, freeze=False)
        if self.last:
            self.ln_f = nn.LayerNorm(spec.hidden)
            if head is not None:
                self.head = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
                with torch.no_grad():
                    self.head.weight.copy_(head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first and self.spec.vocab_size:
            x = self.embedding(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.spec.recompute else block(x)
        if self.last:
            x = self.ln_f(x)
            if self.spec.vocab_size:
                x = self.head(x)
        return x


def training_loss(spec: TransformerSpec, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the LM head's logits, or the MSE against a random activation target."""
    if spec.vocab_size:
        return F.cross_entropy(output.float(), target)
    return F.mse_loss(output, target)


def sequence_batch(spec: TransformerSpec, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences first..first+count-1 of the global batch (input, target), each drawn from
    (seed, its index): any layout's ranks see the same data as the unpartitioned model's."""
    inputs, targets = [], []
    for index in range(first, first + count):
        rng = np.random.default_rng([spec.seed, 7, index])
        if spec.vocab_size:
            tokens = rng.integers(0, spec.vocab_size, size=2 * spec.seq_len)
            inputs.append(torch.from_numpy(tokens[: spec.seq_len]))
            targets.append(torch.from_numpy(tokens[spec.seq_len :]))
        else:
            inputs.append(torch.from_numpy(rng.standard_normal((spec.seq_len, spec.hidden), dtype=np.float32)))
            targets.append(torch.from_numpy(rng.standard_normal((spec.seq_len, spec.hidden), dtype=np.float32)))
    return torch.cat(inputs), torch.cat(targets)


class ParallelTransformer:
    """One rank of the block stack on the default process group (gloo or NCCL)."""

    def __init__(
        self,
        spec: TransformerSpec,
        rank: int,
        device: torch.device,
        comm_hook: tuple[Any, Callable[..., Any]] | None = None,
        overlap_slices: dict[str, int] | None = None,
    ):
        """`comm_hook`: (state, hook) registered on the DDP module, e.g. the hierarchical
        all-reduce of probes/workloads/hierarchical_allreduce.py; None keeps DDP's own all-reduce.
        `overlap_slices`: the substitution decision's {"b0.out": k, ...}: those row-parallel
        products run overlapped with their all-reduce."""
        if dist.get_world_size() != spec.world_size:
            raise ValueError(f"spec wants world_size={spec.world_size}, the process group has {dist.get_world_size()}")
        device = torch.device(device)
        if device.type != "cuda" and spec.dtype not in CPU_DTYPES:
            raise ValueError(
                f"dtype: {spec.dtype!r} needs a CUDA device (float16 autocast trains with a GradScaler); "
                f"on {device.type} the allowed values are {list(CPU_DTYPES)}"
            )
        self.spec, self.rank, self.device = spec, rank, device
        self.stage = spec.stage_of(rank)
        self.groups: list[Any] = []
        tp_group = self._subgroups(spec.tp_group_of, spec.tensor_parallel > 1).get(spec.tp_group_of(rank))
        dp_group = self._subgroups(spec.dp_group_of, 1 < spec.data_parallel < spec.world_size).get(
            spec.dp_group_of(rank)
        )  # None: the default group
        pp_group = self._subgroups(spec.pp_group_of, 1 < spec.pipeline_parallel < spec.world_size).get(
            spec.pp_group_of(rank)
        )
        # dropout masks: the same on a TP group's ranks (they hold replicated activations),
        # different across data-parallel replicas
        torch.manual_seed(spec.seed * 1_000_003 + spec.dp_rank_of(rank))
        module: nn.Module = BlockStack(spec, tp_group, overlap_slices, self.stage, rank % spec.tensor_parallel)
        module = module.to(device)
        if spec.fsdp != "none":
            module = self._fully_shard(module, dp_group)
        elif spec.data_parallel > 1 and spec.pipeline_parallel == 1:
            module = nn.parallel.DistributedDataParallel(module, process_group=dp_group)
            if comm_hook is not None:
                module.register_comm_hook(*comm_hook)
        self.model = module
        self.dp_group = dp_group
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cuda") if spec.dtype == "float16" else None
        x, target = sequence_batch(spec, spec.dp_rank_of(rank) * spec.batch_size, spec.batch_size)
        self.x, self.target = x.to(device), target.to(device)
        self.schedule = self._pipeline(pp_group) if spec.pipeline_parallel > 1 else None

    def _subgroups(self, group_of: Callable[[int], tuple[int, ...]], needed: bool) -> dict[tuple[int, ...], Any]:
        """Every rank creates every group, in the same order (torch.distributed requires it)."""
        if not needed:
            return {}
        made = {g: dist.new_group(list(g)) for g in sorted({group_of(r) for r in range(self.spec.world_size)})}
        self.groups += list(made.values())
        return made

    def _fully_shard(self, module: nn.Module, dp_group: Any) -> nn.Module:
        """FSDP2 over the data-parallel group, one unit per block and one for the rest."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(dp_group or dist.group.WORLD, self.device.type)
        reshard = self.spec.fsdp == "full_shard"
        for block in module.blocks:  # type: ignore[union-attr]
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        return fully_shard(module, mesh=mesh, reshard_after_forward=reshard)

    def _pipeline(self, pp_group: Any) -> Any:
        """The 1F1B schedule over this rank's pipeline (its stage index = its rank in the group)."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        stage = PipelineStage(
            self.model, self.stage, self.spec.pipeline_parallel, self.device, group=pp_group or dist.group.WORLD
        )
        return Schedule1F1B(
            stage, self.spec.micro_batches, loss_fn=lambda out, target: training_loss(self.spec, out, target)
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for bfloat16 / float16 (parameters, gradients and SGD stay float32);
        float32 runs without autocast, so its step is the op sequence it always was."""
        if self.spec.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.spec.dtype))

    def _synchronised(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradient accumulation: DDP / FSDP reduce gradients on the last micro-batch only."""
        if isinstance(self.model, nn.parallel.DistributedDataParallel) and not last:
            return self.model.no_sync()
        if self.spec.fsdp != "none":
            self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> float:
        """One optimizer step over the local batch; the mean loss over it (NaN on a pipeline's
        stages before the last, which compute none)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            loss = self._pipeline_step()
            if self.spec.data_parallel > 1:
                self._all_reduce_gradients()
        else:
            m, total = self.spec.micro_batches, 0.0
            for i, (x, target) in enumerate(zip(self.x.chunk(m), self.target.chunk(m))):
                with self._synchronised(i == m - 1):
                    with self._autocast():
                        part = training_loss(self.spec, self.model(x), target) / m
                    self._backward(part)
                total += float(part.detach())
            loss = total
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return loss

    def _pipeline_step(self) -> float:
        assert self.schedule is not None
        losses: list[torch.Tensor] = []
        with self._autocast():
            if self.stage == 0:
                self.schedule.step(self.x)
            elif self.stage == self.spec.pipeline_parallel - 1:
                # the losses are what is wanted: the schedule keeps no output chunks for a merge
                self.schedule.step(target=self.target, losses=losses, return_outputs=False)
            else:
                self.schedule.step()
        return float(torch.stack(losses).detach().mean()) if losses else math.nan

    def _all_reduce_gradients(self) -> None:
        """A pipeline stage's data-parallel gradient average after its last backward, in
        buckets of DDP's size, last layer first (as Megatron does without overlap; DDP's
        reducer does not follow the pipeline schedule's interleaved micro-batches)."""
        grads = [p.grad for p in reversed(list(self.model.parameters())) if p.grad is not None]
        bucket: list[torch.Tensor] = []
        for i, grad in enumerate(grads):
            bucket.append(grad)
            if i == len(grads) - 1 or sum(g.numel() * g.element_size() for g in bucket) >= GRADIENT_BUCKET_BYTES:
                flat = torch.cat([g.reshape(-1) for g in bucket])
                dist.all_reduce(flat, group=self.dp_group)
                flat /= self.spec.data_parallel
                for g, piece in zip(bucket, flat.split([g.numel() for g in bucket])):
                    g.copy_(piece.view_as(g))
                bucket = []

    def run(self, iterations: int, warmup: int) -> RunResult:
        result = run_timed_steps(lambda _i: self.step(), iterations, warmup, self.device)
        if self.spec.pipeline_parallel > 1:  # every rank reports the last stage's losses
            losses = torch.tensor(result.losses, dtype=torch.float64, device=self.device)
            dist.broadcast(losses, src=(self.spec.pipeline_parallel - 1) * self.spec.stage_width)
            result.losses = [float(v) for v in losses.tolist()]
        return result

    def close(self) -> None:
        """Destroy the TP / DP / PP subgroups made for this stack (each NCCL communicator holds
        device memory); a calibration builds many stacks on one process group."""
        destroy_groups(self.groups)
        self.groups = []

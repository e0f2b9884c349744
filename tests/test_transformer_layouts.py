"""Every layout the parallelism policy may choose trains like the unpartitioned model: the same
losses, within float32 rounding, over a few SGD steps from the same weights and data (dropout
off, so the runs are deterministic). Ranks are spawned on gloo, CPU devices."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from probes.vocabulary.transformer_spec import TransformerSpec
from probes.workloads.transformer import BlockStack, sequence_batch, training_loss
from tests.spawned import on_gloo_ranks

STEPS = 3
LR = 1e-3  # the workload's SGD learning rate
BASE = dict(layers=2, hidden=32, heads=4, seq_len=8, dropout=0.0, seed=5)

WORLD2 = [
    dict(batch_size=2),
    dict(batch_size=4, tensor_parallel=2),
    dict(batch_size=4, pipeline_parallel=2, micro_batches=2),
    dict(batch_size=4, pipeline_parallel=2, micro_batches=4, recompute=True),
    dict(batch_size=2, micro_batches=2, recompute=True),
    dict(batch_size=4, tensor_parallel=2, recompute=True),
    dict(batch_size=2, fsdp="full_shard"),
    dict(batch_size=2, fsdp="shard_grad_op", micro_batches=2),
    dict(batch_size=2, vocab_size=50),
    dict(batch_size=4, tensor_parallel=2, vocab_size=50),
    dict(batch_size=4, pipeline_parallel=2, micro_batches=2, vocab_size=50),
]
WORLD4 = [
    dict(batch_size=2, tensor_parallel=2),
    dict(batch_size=2, pipeline_parallel=2, micro_batches=2),
    dict(batch_size=4, tensor_parallel=2, pipeline_parallel=2, micro_batches=2, recompute=True, vocab_size=50),
]


def _layout(world: int, **fields) -> TransformerSpec:
    return TransformerSpec(**{**BASE, **fields, "world_size": world})


def _train_layouts(rank: int, layouts: list[dict]) -> list[list[float]]:
    from probes.workloads.transformer import ParallelTransformer

    out = []
    for fields in layouts:
        spec = _layout(torch.distributed.get_world_size(), **fields)
        model = ParallelTransformer(spec, rank, torch.device("cpu"))
        out.append([model.step() for _ in range(STEPS)])
        model.close()
    return out


def _reference(spec: TransformerSpec) -> list[float]:
    """The unpartitioned model on one process: the whole global batch, one micro-batch."""
    whole = replace(
        spec,
        world_size=1,
        tensor_parallel=1,
        pipeline_parallel=1,
        micro_batches=1,
        recompute=False,
        fsdp="none",
        batch_size=spec.global_batch,
    )
    torch.manual_seed(0)
    model = BlockStack(whole, None)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, target = sequence_batch(whole, 0, whole.batch_size)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = training_loss(whole, model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _layout_losses(spec: TransformerSpec, per_rank: dict[int, list[float]]) -> list[float]:
    """The global batch's mean loss per step: the mean over the last stage's data-parallel
    replicas (each reports its local batch's mean)."""
    last = spec.pipeline_parallel - 1
    replicas = [r for r in per_rank if spec.stage_of(r) == last and r % spec.tensor_parallel == 0]
    return [sum(per_rank[r][k] for r in replicas) / len(replicas) for k in range(STEPS)]


def _check(world: int, layouts: list[dict]) -> None:
    results = on_gloo_ranks(functools.partial(_train_layouts, layouts=layouts), world)
    for i, fields in enumerate(layouts):
        spec = _layout(world, **fields)
        got = _layout_losses(spec, {r: results[r][i] for r in results})
        want = _reference(spec)
        assert got == pytest.approx(want, rel=1e-5), spec.layout
        # the check can fail: the steps move the loss by over 10x the tolerance (a gradient
        # scaled wrong, e.g. summed instead of averaged over micro-batches, moves it twice as far)
        assert abs(want[-1] - want[0]) > 10 * 1e-5 * abs(want[0])


def test_world2_layouts_train_like_the_unpartitioned_model():
    _check(2, WORLD2)


@pytest.mark.slow
def test_world4_layouts_train_like_the_unpartitioned_model():
    _check(4, WORLD4)


def test_layout_groups_cover_every_rank_once():
    spec = _layout(8, batch_size=2, tensor_parallel=2, pipeline_parallel=2, micro_batches=2)
    for group_of in (spec.tp_group_of, spec.dp_group_of, spec.pp_group_of):
        groups = {group_of(r) for r in range(8)}
        assert sorted(r for g in groups for r in g) == list(range(8))
        assert all(r in group_of(r) for r in range(8))
    assert [list(spec.stage_layers(s)) for s in range(2)] == [[0], [1]]
    assert [
        list(_layout(2, batch_size=2, layers=5, pipeline_parallel=2, micro_batches=2).stage_layers(s)) for s in range(2)
    ] == [[0, 1, 2], [3, 4]]


def _race(rank: int) -> list[float]:
    from probes.workloads.layout_race import race_layouts

    specs = [_layout(2, batch_size=2), _layout(2, batch_size=4, pipeline_parallel=2, micro_batches=2)]
    race = race_layouts(specs, rank, torch.device("cpu"), rounds=2, steps_per_round=1, warmup=1)
    assert race.round_medians_s.shape == (2, 2) and all(len(r.iteration_s) == 2 for r in race.steps)
    return [float(t) for t in race.plan_seconds()]


def test_a_layout_race_times_every_layout_in_every_round():
    times = on_gloo_ranks(_race, 2)
    assert times[0] == times[1] and all(t > 0 for t in times[0])  # every rank reads the slowest rank's times

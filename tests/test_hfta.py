"""Horizontal fusion: B fused models train exactly like B models trained alone."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.fusion import measure_fusion_width
from probes.workloads.fusion.fused_optim import FusedHyperParams, FusedOptimizer, FusedOptimizerError
from probes.workloads.fusion.hfta import FusedModels, FusionError, RateDropout, build_members, fused_cross_entropy
from probes.workloads.fusion.models import WORKLOADS, batches
from probes.workloads.fusion.trainer import FusedTrainer

SEEDS = [11, 12, 13]
LRS = [3e-3, 1e-3, 3e-4]
DECAY = [0.0, 1e-3, 5e-2]
MOMENTUM = [0.0, 0.5, 0.9]
BETA1 = [0.9, 0.8, 0.95]
BETA2 = [0.999, 0.99, 0.995]


def _torch_optimizer(kind: str, params, i: int) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LRS[i], momentum=MOMENTUM[i], weight_decay=DECAY[i])
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(params, lr=LRS[i], betas=(BETA1[i], BETA2[i]), weight_decay=DECAY[i])


def _train_alone(name: str, kind: str, i: int, data: list) -> tuple[nn.Module, list[float]]:
    torch.manual_seed(SEEDS[i])
    model = WORKLOADS[name].build().train()
    optimizer = _torch_optimizer(kind, model.parameters(), i)
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return model, losses


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fused_gradients_equal_each_models_own(name: str) -> None:
    """One fused forward and backward gives every model exactly the gradient it gets alone."""
    work = WORKLOADS[name]
    x, y = next(batches(work, 16, seed=3))
    fused = FusedModels(build_members(work.build, SEEDS)).train()
    loss, per_model = fused_cross_entropy(fused(x), y)
    loss.backward()
    for i, seed in enumerate(SEEDS):
        torch.manual_seed(seed)
        alone = work.build().train()
        own = F.cross_entropy(alone(x), y)
        own.backward()
        assert float(per_model[i]) == pytest.approx(float(own.detach()), rel=1e-5)
        for key, p in alone.named_parameters():
            assert torch.allclose(fused.params[key].grad[i], p.grad, rtol=1e-4, atol=1e-6), f"{name} model {i}: {key}"


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_fused_optimizer_steps_like_torch(kind: str) -> None:
    """Given the same gradients, the fused optimizer moves each model's slice exactly as
    torch's optimizer moves that model alone, hyper-parameters differing per model."""
    gen = torch.Generator().manual_seed(0)
    stacked = {"w": torch.randn(3, 5, 4, generator=gen), "b": torch.randn(3, 4, generator=gen)}
    fused_params = {k: v.clone().requires_grad_() for k, v in stacked.items()}
    alone = [{k: v[i].clone().requires_grad_() for k, v in stacked.items()} for i in range(3)]
    fused_opt = FusedOptimizer(
        kind, fused_params, FusedHyperParams(lr=LRS, weight_decay=DECAY, momentum=MOMENTUM, beta1=BETA1, beta2=BETA2)
    )
    torch_opts = [_torch_optimizer(kind, list(alone[i].values()), i) for i in range(3)]
    for _ in range(6):
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in stacked.items()}
        for k, p in fused_params.items():
            p.grad = grads[k].clone()
        fused_opt.step()
        for i, opt in enumerate(torch_opts):
            for k, p in alone[i].items():
                p.grad = grads[k][i].clone()
            opt.step()
    for i in range(3):
        for k in stacked:
            assert torch.allclose(fused_params[k][i].detach(), alone[i][k].detach(), rtol=1e-5, atol=1e-7), (kind, i, k)


@pytest.mark.parametrize(
    "name,kind",
    [("pointnet", "sgd"), ("pointnet", "adam"), ("cnn", "adamw"), ("transformer", "adam"), ("transformer", "sgd")],
)
def test_fused_training_equals_separate_training(name: str, kind: str) -> None:
    """Four training steps: per-model losses at every step, and the parameters and batch-norm
    statistics after the last, match three models trained one by one with torch's optimizer.

    SGD: every element. Adam normalises each gradient element, so an element whose gradient
    is zero up to rounding (a channel that ReLU and max-pooling starve) takes a full step on
    rounding noise, in one run one way and in the other run the other; the two runs then
    agree on the losses and on all but a few such elements and the batch-norm statistics
    downstream of them (measured on these seeds: 1.2% of the first PointNet's 5567 elements, 0.05%
    of the others'; a bug in the fused step would move every element), after the gradients and the optimizer step were each shown to match above)."""
    work = WORKLOADS[name]
    data = list(itertools.islice(batches(work, 16, seed=5), 4))
    hyper = FusedHyperParams(lr=LRS, weight_decay=DECAY, momentum=MOMENTUM, beta1=BETA1, beta2=BETA2)
    trainer = FusedTrainer.build(work, SEEDS, hyper, optimizer=kind)
    fused_losses = [trainer.step(x, y).tolist() for x, y in data]
    for i in range(len(SEEDS)):
        alone, losses = _train_alone(name, kind, i, data)
        assert [step[i] for step in fused_losses] == pytest.approx(losses, rel=1e-4, abs=1e-5)
        member = trainer.fused.member(i, alone)
        off = total = 0
        for (key, expected), (_, got) in zip(alone.state_dict().items(), member.state_dict().items()):
            close = torch.isclose(got.float(), expected.float(), rtol=1e-4, atol=2e-5)
            if kind == "sgd" or not expected.is_floating_point():
                assert bool(close.all()), f"{name}/{kind} model {i}: {key}"
            off += int((~close).sum())
            total += close.numel()
        assert off <= 0.02 * total, f"{name}/{kind} model {i}: {off} of {total} elements differ"
    # The models did train, and differently from each other.
    assert fused_losses[0] != fused_losses[-1]
    assert len({round(v, 6) for v in fused_losses[-1]}) == len(SEEDS)


def test_dropout_rate_is_per_model() -> None:
    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = RateDropout()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(x * self.scale)

    fused = FusedModels(build_members(Drop, seeds=[0, 1, 2], dropouts=[0.0, 0.25, 0.6])).train()
    out = fused(torch.ones(20000)).detach()
    zeros = (out == 0).float().mean(dim=1)
    assert zeros[0] == 0
    assert zeros[1] == pytest.approx(0.25, abs=0.02)
    assert zeros[2] == pytest.approx(0.6, abs=0.02)
    assert out[2][out[2] != 0].mean() == pytest.approx(1 / 0.4, rel=1e-5)  # inverted scaling per model
    assert torch.equal(fused.eval()(torch.ones(10)), torch.ones(3, 10))


def test_fused_loss_gives_each_model_its_own_gradient() -> None:
    logits = torch.randn(3, 8, 5, requires_grad=True)
    target = torch.randint(0, 5, (8,))
    total, per_model = fused_cross_entropy(logits, target)
    total.backward()
    for i in range(3):
        alone = logits.detach()[i].clone().requires_grad_()
        loss = F.cross_entropy(alone, target)
        loss.backward()
        assert per_model[i] == pytest.approx(float(loss))
        assert torch.allclose(logits.grad[i], alone.grad)


def test_bad_fusion_requests_are_named() -> None:
    with pytest.raises(FusionError, match="same architecture"):
        FusedModels([nn.Linear(2, 3), nn.Linear(3, 3)])
    with pytest.raises(FusionError, match="dropout"):
        build_members(lambda: nn.Sequential(RateDropout()), seeds=[0], dropouts=[1.0])
    params = {"w": torch.zeros(2, 3, requires_grad=True)}
    with pytest.raises(FusedOptimizerError, match="lr: expected 2 values"):
        FusedOptimizer("adam", params, FusedHyperParams(lr=[0.1, 0.2, 0.3]))
    with pytest.raises(FusedOptimizerError, match="optimizer: expected one of sgd, adam, adamw"):
        FusedOptimizer("lamb", params, FusedHyperParams(lr=0.1))
    with pytest.raises(FusedOptimizerError, match="beta2"):
        FusedOptimizer("adam", params, FusedHyperParams(lr=0.1, beta2=1.0))


def test_probe_measures_throughput_and_memory() -> None:
    row = measure_fusion_width("pointnet", 2, batch_size=8, max_seconds=0.3)
    assert row.op == "fused_training" and row.params["width"] == 2
    assert row.median_s > 0 and row.repeats >= 3  # time_callable's floor when the time budget runs out (a busy host)
    assert row.extra["samples_per_s"] == pytest.approx(2 * 8 / row.median_s)
    assert row.extra["peak_memory_bytes"] >= 0


def test_keep_cuts_models_out_and_the_rest_train_on_unchanged() -> None:
    """Dropping a model mid-run (early stopping) leaves the others exactly where they would be."""
    work = WORKLOADS["cnn"]
    data = list(itertools.islice(batches(work, 8, seed=2), 4))
    hyper = FusedHyperParams(lr=LRS, weight_decay=DECAY, momentum=MOMENTUM, beta1=BETA1, beta2=BETA2)
    cut = FusedTrainer.build(work, SEEDS, hyper, optimizer="sgd")
    for x, y in data[:2]:
        cut.step(x, y)
    cut.keep([2, 0])
    assert cut.fused.width == 2 and cut.optimizer.lr.tolist() == pytest.approx([LRS[2], LRS[0]])
    late = [cut.step(x, y).tolist() for x, y in data[2:]]
    keep_hyper = FusedHyperParams(
        lr=[LRS[2], LRS[0]],
        weight_decay=[DECAY[2], DECAY[0]],
        momentum=[MOMENTUM[2], MOMENTUM[0]],
        beta1=[BETA1[2], BETA1[0]],
        beta2=[BETA2[2], BETA2[0]],
    )
    whole = FusedTrainer.build(work, [SEEDS[2], SEEDS[0]], keep_hyper, optimizer="sgd")
    losses = [whole.step(x, y).tolist() for x, y in data]
    assert sum(late, []) == pytest.approx(sum(losses[2:], []), rel=1e-5)
    for key in whole.fused.params:
        assert torch.allclose(cut.fused.params[key], whole.fused.params[key], rtol=1e-5, atol=1e-7), key
    with pytest.raises(FusionError, match="distinct model indices"):
        cut.keep([0, 0])

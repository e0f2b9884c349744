"""Optimizers over stacked parameters ([B, ...]) with one hyper-parameter value per model.

`torch.optim` takes one learning rate per parameter group; B fused models would need B groups
of views into the stacked tensors, and every update would be B small kernel launches again,
which is what fusion removes. These step all B models with one set of kernels, each
hyper-parameter broadcast from a length-B vector. The arithmetic follows `torch.optim.SGD`
(momentum, no dampening), `torch.optim.Adam` (L2 weight decay added to the gradient) and
`torch.optim.AdamW` (decoupled decay) step for step, so a fused model follows the same
trajectory as the same model trained alone with torch's optimizer (checked in
tests/test_hfta.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

OPTIMIZERS = ("sgd", "adam", "adamw")


class FusedOptimizerError(ValueError):
    pass


def _vector(name: str, values: float | Sequence[float], width: int, device: torch.device) -> torch.Tensor:
    if isinstance(values, (int, float)):
        values = [float(values)] * width
    values = [float(v) for v in values]
    if len(values) != width:
        raise FusedOptimizerError(f"{name}: expected {width} values (one per fused model), got {len(values)}")
    return torch.tensor(values, dtype=torch.float32, device=device)


def _per_model(vector: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] → [B, 1, 1, ...] to broadcast against a stacked parameter."""
    return vector.view(-1, *([1] * (like.dim() - 1))).to(like.dtype)


@dataclass
class FusedHyperParams:
    """Per-model hyper-parameters of a fused optimizer, each a list of length B (a scalar is
    broadcast). `momentum` is SGD's; `beta1`/`beta2` Adam's."""

    lr: Sequence[float] | float
    weight_decay: Sequence[float] | float = 0.0
    momentum: Sequence[float] | float = 0.0
    beta1: Sequence[float] | float = 0.9
    beta2: Sequence[float] | float = 0.999
    eps: float = 1e-8


class FusedOptimizer:
    """`kind` in OPTIMIZERS over a dict of stacked parameters (`FusedModels.params`)."""

    def __init__(self, kind: str, params: dict[str, torch.Tensor], hyper: FusedHyperParams) -> None:
        if kind not in OPTIMIZERS:
            raise FusedOptimizerError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {kind!r}")
        if not params:
            raise FusedOptimizerError("params: expected stacked parameters, got none")
        first = next(iter(params.values()))
        width, device = first.shape[0], first.device
        self.kind, self.params, self.width = kind, params, width
        self.lr = _vector("lr", hyper.lr, width, device)
        self.weight_decay = _vector("weight_decay", hyper.weight_decay, width, device)
        self.momentum = _vector("momentum", hyper.momentum, width, device)
        self.beta1 = _vector("beta1", hyper.beta1, width, device)
        self.beta2 = _vector("beta2", hyper.beta2, width, device)
        self.eps = float(hyper.eps)
        for name, vec in (("lr", self.lr), ("weight_decay", self.weight_decay), ("momentum", self.momentum)):
            if bool((vec < 0).any()):
                raise FusedOptimizerError(f"{name}: expected values >= 0, got {vec.tolist()}")
        for name, vec in (("beta1", self.beta1), ("beta2", self.beta2)):
            if bool(((vec < 0) | (vec >= 1)).any()):
                raise FusedOptimizerError(f"{name}: expected values in [0, 1), got {vec.tolist()}")
        self.state: dict[str, dict[str, torch.Tensor]] = {}
        self.steps = 0

    def keep(self, indices: Sequence[int], params: dict[str, torch.Tensor]) -> None:
        """Continue with the models at `indices` only, on `params` (the sliced stacked
        parameters): the hyper-parameter vectors and every state tensor are sliced alike."""
        index = torch.tensor([int(i) for i in indices], dtype=torch.long)
        for name in ("lr", "weight_decay", "momentum", "beta1", "beta2"):
            setattr(self, name, getattr(self, name)[index.to(getattr(self, name).device)])
        self.state = {k: {s: t[index.to(t.device)].clone() for s, t in st.items()} for k, st in self.state.items()}
        self.params = params
        self.width = len(index)

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        for name, p in self.params.items():
            if p.grad is None:
                continue
            state = self.state.setdefault(name, {})
            if self.kind == "sgd":
                self._sgd(p, p.grad, state)
            else:
                self._adam(p, p.grad, state, decoupled=self.kind == "adamw")

    def _sgd(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        g = grad + _per_model(self.weight_decay, p) * p
        momentum = _per_model(self.momentum, p)
        if "momentum_buffer" not in state:
            buf = state["momentum_buffer"] = g.clone()  # torch: the first step's buffer is the gradient
        else:
            buf = state["momentum_buffer"]
            buf.mul_(momentum).add_(g)
        # A model with momentum 0 steps on its plain gradient (torch skips the buffer then).
        direction = torch.where(momentum > 0, buf, g)
        p.sub_(_per_model(self.lr, p) * direction)

    def _adam(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], decoupled: bool) -> None:
        lr, wd = _per_model(self.lr, p), _per_model(self.weight_decay, p)
        beta1, beta2 = _per_model(self.beta1, p), _per_model(self.beta2, p)
        if decoupled:
            p.mul_(1 - lr * wd)
            g = grad
        else:
            g = grad + wd * p
        if not state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        bias1 = 1 - beta1**self.steps
        bias2 = 1 - beta2**self.steps
        denom = (v.sqrt() / bias2.sqrt()).add_(self.eps)
        p.sub_((lr / bias1) * m / denom)

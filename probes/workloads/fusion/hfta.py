"""B models trained as one: stacked parameters, every operator batched over the model axis.

HFTA replaces each operator of B identical-architecture models with its batched form (linear
→ baddbmm, conv → grouped conv, norms over a model dimension). `torch.func` does exactly that
substitution generically: `stack_module_state` stacks the B models' parameters and buffers
along a new leading axis, and `vmap` over `functional_call` runs one module definition with
each model's slice, dispatching every op to its batched kernel (vmap's conv rule is a grouped
convolution, its matmul rule a batched matmul). So any model built from the usual layers
fuses without rewriting it.

What vmap alone does not give, and this module adds:
- per-model dropout *rates*: `RateDropout` keeps its rate in a buffer, so stacking the models
  gives each its own rate, and its mask is drawn per model (`randomness="different"`);
- batch norm: running statistics are buffers too, stacked per model, so each model's
  statistics are updated from its own activations, as if it ran alone;
- the loss: each model's own mean loss, summed over models. The models share no parameters,
  so the gradient of the sum with respect to model i's slice is model i's own gradient (the
  HFTA paper scales a mean over the fused batch by B to the same effect).
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap


class FusionError(ValueError):
    """A fusion request that cannot be built (no models, mixed architectures, bad rates)."""


class RateDropout(nn.Module):
    """Inverted dropout whose rate is a buffer, so fused models can each have their own rate.

    Same semantics as `nn.Dropout(p)`: zero each element with probability p in training and
    scale the survivors by 1/(1-p); identity in eval."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= float(p) < 1.0:
            raise FusionError(f"dropout: expected 0 <= p < 1, got {p!r}")
        self.register_buffer("p", torch.tensor(float(p)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = (torch.rand_like(x) >= self.p).to(x.dtype)
        return x * keep / (1.0 - self.p)


def set_dropout(model: nn.Module, p: float) -> nn.Module:
    """Set every `RateDropout` of `model` to rate `p` (a model hyper-parameter)."""
    if not 0.0 <= float(p) < 1.0:
        raise FusionError(f"dropout: expected 0 <= p < 1, got {p!r}")
    for module in model.modules():
        if isinstance(module, RateDropout):
            module.p.fill_(float(p))
    return model


def build_members(
    factory: Callable[[], nn.Module],
    seeds: Sequence[int],
    dropouts: Sequence[float] | None = None,
    device: torch.device | str = "cpu",
) -> list[nn.Module]:
    """The B separate models a fused job stands for: `factory()` under each seed (the init
    seed is a fusible hyper-parameter), each with its dropout rate."""
    if not seeds:
        raise FusionError("seeds: expected at least one model to fuse, got none")
    dropouts = list(dropouts) if dropouts is not None else [0.0] * len(seeds)
    if len(dropouts) != len(seeds):
        raise FusionError(f"dropouts: expected {len(seeds)} rates (one per seed), got {len(dropouts)}")
    members = []
    for seed, p in zip(seeds, dropouts):
        torch.manual_seed(int(seed))
        members.append(set_dropout(factory(), p).to(device))
    return members


class FusedModels:
    """B models of one architecture as one: `params[name]` and `buffers[name]` hold every
    model's tensor stacked on a leading axis of size B; `__call__(x)` runs all B on the same
    input batch and returns outputs stacked the same way ([B, N, ...])."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        if not members:
            raise FusionError("members: expected at least one model to fuse, got none")
        shapes = [tuple((k, tuple(v.shape)) for k, v in m.state_dict().items()) for m in members]
        if any(s != shapes[0] for s in shapes[1:]):
            raise FusionError("members: every fused model must have the same architecture (same state_dict shapes)")
        params, buffers = stack_module_state(list(members))
        self.params: dict[str, torch.Tensor] = params
        self.buffers: dict[str, torch.Tensor] = buffers
        self.width = len(members)
        # A stateless copy to run functional_call on; its own tensors are never used.
        self._base = copy.deepcopy(members[0]).to("meta")
        self._base.train(members[0].training)

    @property
    def training(self) -> bool:
        return self._base.training

    def train(self, mode: bool = True) -> "FusedModels":
        self._base.train(mode)
        return self

    def eval(self) -> "FusedModels":
        return self.train(False)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def _one(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self._base, (params, buffers), (x,))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return vmap(self._one, in_dims=(0, 0, None), randomness="different")(self.params, self.buffers, x)

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the models at `indices` (in that order): every stacked tensor is sliced,
        parameters become new leaves (their gradients start afresh)."""
        index = _indices(indices, self.width)
        self.params = {k: v.detach()[index].clone().requires_grad_(v.requires_grad) for k, v in self.params.items()}
        self.buffers = {k: v[index].clone() for k, v in self.buffers.items()}
        self.width = len(index)

    def member(self, index: int, like: nn.Module) -> nn.Module:
        """Model `index` as a plain module (a copy of `like` holding that model's tensors)."""
        if not 0 <= index < self.width:
            raise FusionError(f"index: expected 0..{self.width - 1}, got {index}")
        out = copy.deepcopy(like)
        state = {k: v[index].detach().clone() for k, v in {**self.params, **self.buffers}.items()}
        out.load_state_dict(state)
        return out


def _indices(indices: Sequence[int], width: int) -> torch.Tensor:
    index = [int(i) for i in indices]
    if not index or len(set(index)) != len(index) or not all(0 <= i < width for i in index):
        raise FusionError(f"indices: expected distinct model indices in 0..{width - 1}, got {list(indices)}")
    return torch.tensor(index, dtype=torch.long)


def fused_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to backpropagate, each model's own loss). `logits` is [B, N, C], `target` [N]
    (every model sees the same batch). Each model's loss is its mean cross-entropy, the
    backward loss their sum, so every model gets exactly its own gradient."""
    if logits.dim() != 3:
        raise FusionError(f"logits: expected [models, batch, classes], got shape {tuple(logits.shape)}")
    width, n, classes = logits.shape
    per_element = F.cross_entropy(logits.reshape(width * n, classes), target.repeat(width), reduction="none")
    per_model = per_element.view(width, n).mean(dim=1)
    return per_model.sum(), per_model.detach()

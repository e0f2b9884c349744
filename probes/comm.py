"""The one communication rule: every tensor handed to torch.distributed lives on the group's
device, which is the device the rank computes on (CUDA with NCCL, the CPU with gloo).

NCCL serves CUDA tensors only: a control tensor (an agreed repeat count, a step time, a
median) left on the CPU raises "No backend type associated with device type cpu" on a GPU
cluster, while on gloo it passes silently. So probes, workloads, overlapped pairs, the
hierarchical all-reduce and launched jobs create every tensor they communicate with an explicit
`device=` (or derive it from one that has it), and `on_host` brings results back.

`audit` is how the rule is checked where no GPU exists: inside it, every tensor created by a
torch factory without an explicit device is marked, and every torch.distributed call refuses a
tensor that is marked or sits on another device than the group's. On a CPU machine a forgotten
`device=` is invisible (the default device *is* the CPU); the mark makes it visible, so a CPU
test fails exactly where a GPU run would.

Point-to-point exchanges go through `batch_isend_irecv` (NCCL ignores tags and runs separate
sends and receives in issue order, which deadlocks when two ranks each wait on a send the other
has not yet received), and subgroups made for a probe are destroyed after it (each NCCL
communicator holds device buffers).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

# torch.distributed entry points whose tensor arguments the audit checks.
AUDITED = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_single",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "isend",
    "irecv",
    "send",
    "recv",
    "batch_isend_irecv",
    "reduce",
    "gather",
    "scatter",
)
_MARK = "_created_without_device"
# P2POp accepts only these very functions (not `audit`'s checked stand-ins).
_ISEND, _IRECV = dist.isend, dist.irecv


class CommDeviceError(RuntimeError):
    """A tensor handed to torch.distributed that is not on the group's device."""


def _factories() -> set[Callable[..., Any]]:
    from torch.utils._device import _device_constructors

    return set(_device_constructors())


class _MarkImplicitDevice(TorchFunctionMode):
    """Marks tensors made by a torch factory (zeros, tensor, empty, randn, ...) called without
    `device=`: on a GPU rank such a tensor lands on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.factories = _factories()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in self.factories and kwargs.get("device") is None and isinstance(out, torch.Tensor):
            try:
                setattr(out, _MARK, True)
            except (AttributeError, RuntimeError):
                pass
        return out


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dist.P2POp):
        yield value.tensor
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def check_tensors(op: str, values: Iterable[Any], device: torch.device) -> None:
    """Raise `CommDeviceError` for the first tensor among `values` off `device` or made
    without an explicit device."""
    for t in _tensors(list(values)):
        if getattr(t, _MARK, False):
            raise CommDeviceError(
                f"torch.distributed.{op}: a tensor {tuple(t.shape)} created without device= "
                f"(it would sit on the CPU on a GPU rank); the group's device is {device}"
            )
        if not same_device(t.device, device):
            raise CommDeviceError(
                f"torch.distributed.{op}: a tensor {tuple(t.shape)} on {t.device}; the group's device is {device}"
            )


def same_device(a: torch.device, b: torch.device) -> bool:
    """Same type, and the same index where both name one (cuda == cuda:0 on a one-GPU rank)."""
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


@contextlib.contextmanager
def audit(device: torch.device | str, calls: Counter | None = None) -> Iterator[None]:
    """Check every torch.distributed call made inside against `device` (see the module doc);
    `calls`, when given, counts the calls by name (those made inside another audited call, such
    as the sends of a `batch_isend_irecv`, are not counted)."""
    device = torch.device(device)
    originals: dict[str, Callable[..., Any]] = {}
    depth = [0]

    def checked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            check_tensors(name, [*args, *kwargs.values()], device)
            if calls is not None and depth[0] == 0:
                calls[name] += 1
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    for name in AUDITED:
        fn = getattr(dist, name, None)
        if callable(fn):
            originals[name] = fn
            setattr(dist, name, checked(name, fn))
    try:
        with _MarkImplicitDevice():
            yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Gather every rank's equal share into one flat tensor.

    `dist.all_gather_single` where this torch has it (2.13 deprecates the older name), else
    `dist.all_gather_into_tensor`: the GPU images users (and the GPU check) run may carry an
    older torch than the one this project pins. Looked up at call time, so `audit` sees it.
    """
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Sum over ranks and keep this rank's equal share; `dist.reduce_scatter_single` where this
    torch has it, else its older name `dist.reduce_scatter_tensor` (see `all_gather_single`)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, group=group, async_op=async_op)


def on_host(t: torch.Tensor) -> torch.Tensor:
    """A communicated result brought back to the CPU (for numpy and JSON)."""
    return t.detach().cpu()


@contextlib.contextmanager
def comm_stream(device: torch.device | str) -> Iterator[None]:
    """On CUDA, issue the enclosed communication from a side stream that first waits for the
    compute stream's work so far (the slice it sends is written), and make the compute stream
    wait for it on exit; elsewhere, nothing."""
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    compute = torch.cuda.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(compute)
    with torch.cuda.stream(side):
        yield
    compute.wait_stream(side)


_streams: dict[Any, Any] = {}


def _side_stream(device: torch.device) -> Any:
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _streams:
        _streams[key] = torch.cuda.Stream(device=device)
    return _streams[key]


def exchange(ops: Sequence[tuple[str, torch.Tensor, int]], group: Any = None, tag: int = 0) -> list[Any]:
    """One batch of point-to-point transfers, ("send" | "recv", tensor, peer's global rank) each,
    issued together (`batch_isend_irecv`); the works to wait on. Empty: no call, no works."""
    if not ops:
        return []
    p2p = [dist.P2POp(_ISEND if kind == "send" else _IRECV, tensor, peer, group, tag) for kind, tensor, peer in ops]
    return list(dist.batch_isend_irecv(p2p))


def destroy_groups(groups: Iterable[Any]) -> None:
    """Destroy subgroups made for a probe or a job (never the default group)."""
    for group in groups:
        if group is not None and group != dist.GroupMember.WORLD:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)

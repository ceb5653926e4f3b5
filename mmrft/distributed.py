"""Data-parallel training across processes (``accelerate launch`` or ``torchrun``).

accelerate's ``PartialState`` reads the launcher's environment and creates the process group
(NCCL on GPUs, gloo on CPU). mmrft then splits each step's prompts across ranks, whole groups
per rank, so every group's advantages are computed over the whole group on one rank; the
step-wide token and sequence counts are summed over ranks, so each rank's loss carries the
global denominators; and after the micro-batches of an update the gradients are summed with
one all-reduce. The update therefore equals one process on the same global batch.

Why not ``DistributedDataParallel``: its hooks all-reduce on every backward and need the same
number of backward calls on every rank, but ranks skip different numbers of zero-advantage
completions; one all-reduce of the accumulated gradient per update is also less traffic.
Parameters and optimizer states stay replicated, so rank 0's checkpoint is complete and loads
on any number of processes. Sharded training (FSDP / ZeRO) is not implemented yet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def setup() -> tuple[int, int]:
    """(rank, world size); initialise the process group when launched with several processes."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def sum_scalar(value: float) -> float:
    """Σ over ranks of a Python number."""
    if world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(tensor)
    return float(tensor.item())


def sum_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Σ over ranks of every gradient (missing gradients count as zeros), in one flat buffer."""
    if world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank."""
    if world_size() == 1:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (on every rank)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _device() -> torch.device:
    backend = dist.get_backend()
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )

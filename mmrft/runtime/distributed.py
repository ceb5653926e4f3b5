"""Data-parallel training across processes (``accelerate launch`` or ``torchrun``).

accelerate's ``PartialState`` reads the launcher's environment and creates the process group
(NCCL on GPUs, gloo on CPU). mmrft then splits each step's prompts across ranks, whole groups
per rank, so every group's advantages are computed over the whole group on one rank; the
step-wide token and sequence counts are summed over ranks, so each rank's loss carries the
global denominators; and the gradients are *summed* over ranks. The update therefore equals one
process on the same global batch. ``train.sharding`` chooses how parameters are held:

``none`` (replicated): parameters and optimizer states are replicated; after the micro-batches
of an update the gradients are summed with one all-reduce (``sum_gradients``). Not
``DistributedDataParallel``: its hooks all-reduce on every backward and need the same number of
backward calls on every rank, but ranks skip different numbers of zero-advantage completions;
one all-reduce of the accumulated gradient per update is also less traffic.

``fsdp_full`` / ``fsdp_grad_op`` (sharded, ``shard_model``): PyTorch FSDP2
(``torch.distributed.fsdp.fully_shard``, per-parameter DTensor sharding). Every parameter,
gradient and optimizer state is split over the ranks (ZeRO-3); ``fsdp_full`` frees the gathered
parameters after each unit's forward and gathers them again for backward, ``fsdp_grad_op`` keeps
them from forward to backward (ZeRO-2's communication, more memory). The FSDP units are the
text decoder's layers (modules of the classes in the model's ``_no_split_modules``, the list
accelerate and transformers auto-wrap by, found under ``model.get_decoder()``), then the root
model holds the rest: embeddings, LM head, final norm and the vision / audio encoders. The
encoders are deliberately *not* units of their own: a forward calls them zero, one or two
times depending on the media of its batch (text-only, images, images and videos), which
differs between ranks, and an FSDP unit all-gathers on every call, so per-block units would
hang. Inside the root unit they are gathered once per forward, whatever runs. What FSDP
demands and how mmrft meets it:

- every rank runs the same sequence of forward/backward passes: ranks agree on the number of
  micro-batches (the maximum over ranks, ``max_scalar``) and pad with passes whose loss is
  multiplied by 0 (``padding_loss``), so every unit's all-gather and reduce-scatter has its
  partner on every rank; gradients of parameters a rank did not use (an encoder on a text-only
  batch) enter the reduce-scatter as zeros (``set_reduce_scatter_unused_params``).
- the reduce-scatter is a sum (``set_gradient_divide_factor(1.0)`` with sum-only collectives:
  gloo has no pre-multiplied sum), as ``sum_gradients`` is. It runs after every backward, and
  the sharded gradients accumulate across micro-batches; skipping it until the last micro-batch
  (``set_requires_gradient_sync(False)``) would keep a whole unsharded gradient per rank, which
  is what sharding exists to avoid.
- generation runs inside ``gathered``: all parameters are all-gathered once, every rank then
  generates as many tokens as it needs with no collective (transformers' synced generation is
  switched off in ``HFEngine``), and the parameters are freed again. A per-layer all-gather
  per generated token would need equal lengths on every rank; the price is the whole policy's
  weights on every device while it generates (what DeepSpeed ZeRO-3 generation in TRL does
  too). Evaluation gathers on every rank and generates on rank 0.
- ``clip_grad_norm_`` over DTensor gradients returns the global norm as a DTensor;
  ``full_tensor`` makes it a plain number.
- checkpoints stay independent of the world size: ``full_model_state`` / ``full_optimizer_state``
  gather the full state on rank 0 (torch.distributed.checkpoint's state-dict API) in exactly
  the layout of an unsharded run (``save_pretrained`` safetensors; ``optimizer.state_dict()``
  keyed by parameter index), and ``load_full_model_state`` / ``load_full_optimizer_state``
  scatter such a state from rank 0 into the shards.
- the reference model (β > 0) is sharded the same way and frees its gathered parameters after
  every forward in both modes (it never runs backward); its log-prob passes are padded too.
- the replica check (``training.resume.check_replicas``) is skipped: there is one sharded copy.

Each rank loads the whole model before sharding it (peak memory at start-up: one full model
per device). With one process there is nothing to shard and ``train.sharding`` is ignored.

LoRA: the frozen base weights are sharded with the adapters in the same units (FSDP2 lets a
unit mix frozen and trained parameters; only the trained ones are reduce-scattered), so every
rank holds 1/N of the base model as well. Frozen input embeddings would let a text-only pass
reduce-scatter the first decoder layer at a different point of backward than a pass with
images, so the embedding output is made to require grad (``shard_model``). Checkpoints gather
the full state on rank 0 and merge the adapters there (``policy.merged_weights``).

``deepspeed_zero2`` / ``deepspeed_zero3``: DeepSpeed's ZeRO engine holds the partitions, reduces
and clips the gradients and steps the optimizer, inside mmrft's loop (``mmrft/runtime/zero.py``). It
needs every rank to run the same modules in each pass (checked), which FSDP2 here does not.

The functions below that take a model dispatch on how it is held (replicated, FSDP2, ZeRO), so
the trainer reads the same for all of them. ``sharding_from_launcher`` turns an accelerate
config of ``distributed_type: FSDP`` (FSDP2) or ``DEEPSPEED`` into ``train.sharding``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mmrft.runtime import zero

log = logging.getLogger("mmrft")

SHARDING = ("none", "fsdp_full", "fsdp_grad_op", "deepspeed_zero2", "deepspeed_zero3")


def setup() -> tuple[int, int]:
    """(rank, world size); initialise the process group when launched with several processes."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def teardown() -> None:
    """End a run that finished on every process: a barrier (no rank is still inside a
    collective), then ``destroy_process_group`` (PyTorch's documented shutdown). Only after
    success: after an error a rank may still wait in a collective, and the others would hang
    here instead of exiting. Nothing in one process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def sharding_from_launcher(sharding: str, deepspeed: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(train.sharding, train.deepspeed)`` with what an ``accelerate launch`` config asks for.

    mmrft never calls ``Accelerator.prepare`` (it owns the update loop), so accelerate's FSDP
    and DeepSpeed settings, which it passes to the processes as environment variables, are
    translated here instead of being silently ignored:

    - ``distributed_type: FSDP`` with ``fsdp_version: 2``: ``fsdp_reshard_after_forward``
      true → ``fsdp_full``, false → ``fsdp_grad_op``. FSDP1 is refused (mmrft shards with FSDP2).
    - ``distributed_type: DEEPSPEED``: ``zero_stage`` 2/3 → ``deepspeed_zero2/3``;
      ``offload_optimizer_device`` / ``offload_param_device`` → ZeRO offload settings;
      ``deepspeed_config_file``: its ``zero_optimization`` section (stage included). The
      file's other sections (batch sizes, optimizer, scheduler, precision, clipping) are
      mmrft's config's business and are ignored with a warning naming them.

    A config that already sets ``train.sharding`` to something else is an error naming both.
    """
    from mmrft.typecheck import ConfigError

    wanted, settings = None, dict(deepspeed)
    if _env_flag("ACCELERATE_USE_FSDP"):
        version = os.environ.get("FSDP_VERSION", "1")
        if version != "2":
            raise ConfigError(
                f"accelerate config: fsdp_version {version} — mmrft shards with FSDP2; set "
                "fsdp_version: 2 (see configs/accelerate/fsdp2.yaml)"
            )
        if _env_flag("FSDP_CPU_RAM_EFFICIENT_LOADING"):
            raise ConfigError(
                "accelerate config: fsdp_cpu_ram_efficient_loading true makes transformers load "
                "the weights of ranks > 0 on the meta device; mmrft loads on every rank and "
                "broadcasts rank 0's, so set it to false (see configs/accelerate/fsdp2.yaml)"
            )
        reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower()
        wanted = "fsdp_grad_op" if reshard in ("false", "shard_grad_op") else "fsdp_full"
    elif _env_flag("ACCELERATE_USE_DEEPSPEED"):
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        if path and path.lower() != "none":
            file_config = json.loads(Path(path).read_text())
            zero = dict(file_config.get("zero_optimization") or {})
            stage = str(zero.pop("stage", stage))
            settings = {**zero, **settings}
            ignored = sorted(k for k in file_config if k != "zero_optimization")
            if ignored:
                log.warning(
                    "%s: %s ignored (mmrft sets batch sizes, optimizer, scheduler, precision and "
                    "clipping from its own config)",
                    path,
                    ", ".join(ignored),
                )
        for variable, key in (
            ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "offload_optimizer"),
            ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "offload_param"),
        ):
            device = os.environ.get(variable, "none").lower()
            if device not in ("", "none") and key not in settings:
                settings[key] = {"device": device}
        if stage not in ("2", "3"):
            raise ConfigError(
                f"accelerate config: zero_stage {stage} — mmrft runs DeepSpeed ZeRO stage 2 or 3 "
                "(configs/accelerate/deepspeed_zero2.yaml, deepspeed_zero3.yaml)"
            )
        wanted = f"deepspeed_zero{stage}"
    if wanted is None:
        return sharding, settings
    if sharding not in ("none", wanted):
        raise ConfigError(
            f"train.sharding: '{sharding}' but the accelerate config asks for '{wanted}'; "
            "set one of them"
        )
    log.info("train.sharding=%s from the accelerate config", wanted)
    return wanted, settings


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


_THREAD = threading.local()  # .group: the process group of this thread's small collectives


def side_group() -> Any:
    """A second process group (gloo) over every rank, for a thread whose collectives run
    while the main thread's run on the default group (the asynchronous collector's rollout
    thread, ``mmrft.rollout.ahead``): two threads must not share one group, whose collectives pair
    up by order alone. Every rank creates it at the same point (the creation is collective).
    None in one process."""
    return dist.new_group(backend="gloo") if world_size() > 1 else None


@contextlib.contextmanager
def collectives_on(group: Any) -> Iterator[None]:
    """Route this thread's small collectives (:func:`barrier`, :func:`sum_scalar`,
    :func:`max_scalar`, :func:`gather_objects`, :func:`broadcast_object`) through ``group``
    (from :func:`side_group`; None = the default group) for the duration."""
    previous = getattr(_THREAD, "group", None)
    _THREAD.group = group
    try:
        yield
    finally:
        _THREAD.group = previous


def _small() -> tuple[Any, torch.device]:
    """This thread's group for small collectives and the device their tensors live on (a
    side group is gloo: CPU)."""
    group = getattr(_THREAD, "group", None)
    return group, (torch.device("cpu") if group is not None else _device())


def barrier() -> None:
    if world_size() > 1:
        dist.barrier(group=_small()[0])


def sum_scalar(value: float) -> float:
    """Σ over ranks of a Python number."""
    if world_size() == 1:
        return value
    group, device = _small()
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, group=group)
    return float(tensor.item())


def max_scalar(value: float) -> float:
    """max over ranks of a Python number."""
    if world_size() == 1:
        return value
    group, device = _small()
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return float(tensor.item())


def sum_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Σ over ranks of every gradient (missing gradients count as zeros), in one flat buffer.

    Sharded parameters (DTensors) are skipped: FSDP's backward already reduce-scattered their
    gradients as a sum (see ``shard_model``).
    """
    if world_size() == 1:
        return
    params = [p for p in params if p.requires_grad and not _is_dtensor(p)]
    if not params:
        return
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
    dist.all_gather_object(out, obj, group=_small()[0])
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_small()[0])
    return box[0]


# ---------------------------------------------------------------------------------------------
# Sharded training (FSDP2)

_MESH: tuple[Any, Any] = (None, None)  # (the process group it was made for, the mesh)


def _mesh() -> Any:
    """One device mesh over all ranks, shared by the policy and the reference model (made again
    if the process group was)."""
    global _MESH
    if _MESH[1] is None or _MESH[0] is not dist.group.WORLD:
        from torch.distributed.device_mesh import init_device_mesh

        _MESH = (dist.group.WORLD, init_device_mesh(_device().type, (world_size(),)))
    return _MESH[1]


def _is_dtensor(tensor: Any) -> bool:
    if "torch.distributed.tensor" not in sys.modules:  # never imported: no DTensor exists
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective), any other tensor as it is."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that become FSDP units of their own: the outermost modules of the classes
    in ``model._no_split_modules`` under ``model.get_decoder()`` (the text decoder's layers).
    Media encoders stay in the root unit (see the module docstring)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    get_decoder = getattr(model, "get_decoder", None)
    scope = get_decoder() if callable(get_decoder) else None
    if scope is None:
        scope = model
    units: list[tuple[str, torch.nn.Module]] = []
    for name, module in scope.named_modules():
        if type(module).__name__ not in names or module is model:
            continue
        if any(name.startswith(outer + ".") for outer, _ in units):
            continue  # nested inside a unit already chosen
        units.append((name, module))
    return [module for _, module in units]


_FSDP_API = (
    "set_gradient_divide_factor",
    "set_force_sum_reduction_for_comms",
    "set_reduce_scatter_unused_params",
)


def shard_model(
    model: torch.nn.Module,
    mode: str,
    *,
    frozen: bool = False,
    deepspeed_config: dict[str, Any] | None = None,
) -> bool:
    """Shard ``model`` in place (``mode``: one of ``SHARDING``); True if its parameters are now
    partitioned.

    FSDP2 modes shard here. DeepSpeed modes partition only a ``frozen`` model here (the ZeRO-3
    reference model, with ``deepspeed_config``); a trained model's engine is built together
    with its optimizer by ``prepare_optimizer``. ``frozen`` (a reference model, never
    backpropagated): FSDP frees parameters after every forward whatever the mode. One process
    has nothing to shard: the model is left as it is.
    """
    if mode not in SHARDING:
        raise ValueError(f"unknown sharding mode {mode!r}; one of {SHARDING}")
    if mode == "none":
        return False
    if world_size() == 1:
        log.info("train.sharding=%s with one process: nothing to shard, training unsharded", mode)
        return False
    if mode in zero.STAGES:  # the policy's engine is built with its optimizer (prepare_optimizer)
        if frozen and zero.STAGES[mode] == 3:
            zero.initialize(model, None, deepspeed_config)
            return True
        return False
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:  # torch < 2.6
        FSDPModule = fully_shard = None
    missing = [name for name in _FSDP_API if not hasattr(FSDPModule, name)]
    if fully_shard is None or missing:
        raise RuntimeError(
            f"train.sharding={mode} needs FSDP2 (torch.distributed.fsdp.fully_shard) with "
            f"FSDPModule.{', FSDPModule.'.join(missing or _FSDP_API)}, which torch "
            f"{torch.__version__} lacks; upgrade torch (tested with 2.14) or use train.sharding=none"
        )

    mesh = _mesh()
    reshard = frozen or mode == "fsdp_full"
    if not frozen and not model.get_input_embeddings().weight.requires_grad:
        # Frozen input embeddings (LoRA): a text-only pass would feed the first layer a
        # hidden state without grad, so that layer's reduce-scatter would run at the end of
        # backward (after the root's) instead of when its input gradient is computed, while a
        # rank with images runs it first: the ranks' collectives would pair up wrongly. With a
        # grad-requiring embedding output (what transformers does for gradient checkpointing),
        # every pass's backward runs the units in the same order.
        model.enable_input_require_grads()
    units = shard_units(model)
    kinds = ", ".join(sorted({type(u).__name__ for u in units})) or "none"
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    # FSDP2 warns on every forward whose root returns a view (the logits cut to
    # logits_to_keep): an in-place op on it would skip the all-gather. mmrft reads the logits
    # out of place only (policy.completion_logps), and tests/test_sharding.py checks that two
    # sharded ranks' gradients equal one process's, so here the warning is noise.
    warnings.filterwarnings(
        "ignore",
        message=r"FSDP2-wrapped module \(FSDP\w+\) returned a view tensor",
        category=UserWarning,
    )
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Σ over ranks, like sum_gradients: the loss already carries the global
            # denominators. Sum-only collectives: gloo has no pre-multiplied sum.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    model.set_reduce_scatter_unused_params(True)  # type: ignore[operator]
    model._mmrft_reshard_after_forward = reshard  # type: ignore[assignment]
    log.info(
        "%s %s: %d FSDP units (%s) + the root, over %d ranks",
        "reference" if frozen else "policy",
        mode,
        len(units),
        kinds,
        world_size(),
    )
    return True


def prepare_optimizer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mode: str,
    deepspeed_config: dict[str, Any],
) -> None:
    """DeepSpeed modes with several processes: build the ZeRO engine that holds ``model`` and
    ``optimizer`` from now on (after any weights were loaded, so its fp32 master weights start
    from them). Anything else: nothing to do."""
    if mode in zero.STAGES and world_size() > 1:
        zero.initialize(model, optimizer, deepspeed_config)


def _is_fsdp(model: torch.nn.Module) -> bool:
    if "torch.distributed.fsdp" not in sys.modules:  # never imported (~1 s): nothing sharded
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6: no FSDP2
        return False
    return isinstance(model, FSDPModule)


def is_sharded(model: torch.nn.Module) -> bool:
    """The model's parameters are partitioned over the ranks (FSDP2 or ZeRO-3): no rank holds
    a whole replica."""
    return _is_fsdp(model) or zero.stage_of(model) == 3


def passes_must_match(model: torch.nn.Module) -> bool:
    """Every rank must run as many forward/backward passes as the others (their collectives
    pair up): FSDP2 and ZeRO. The trainer pads with zero-loss passes."""
    return _is_fsdp(model) or zero.engine_of(model) is not None


def same_graph_required(model: torch.nn.Module) -> bool:
    """Every rank's pass must also run the same modules (ZeRO's hooks; see mmrft/runtime/zero.py), so a
    padding pass repeats one of the rank's own inputs rather than a text-only one."""
    return zero.engine_of(model) is not None


def module_to_call(model: torch.nn.Module) -> Any:
    """What a training forward calls: the DeepSpeed engine, or the model."""
    return zero.module_to_call(model)


def backward(model: torch.nn.Module, loss: torch.Tensor) -> None:
    """``loss.backward()``, or the DeepSpeed engine's backward (summed over ranks)."""
    zero.backward(model, loss)


def clip_and_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    check_norm: Any,
) -> float:
    """End an update: sum the gradients over ranks, clip their global norm to
    ``max_grad_norm`` (0: no clipping), ``check_norm(norm)`` (it raises on a non-finite norm),
    step and zero the gradients. Returns the global norm before clipping.

    DeepSpeed clips and steps in one call, so there ``check_norm`` sees the norm after the
    step (the run still stops before any checkpoint of it).
    """
    if zero.engine_of(model) is not None:
        norm = zero.step(model)
        check_norm(norm)
        return norm
    params = [p for p in model.parameters() if p.requires_grad]
    sum_gradients(params)  # unsharded; FSDP's backward already summed
    if max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    norm = float(full_tensor(norm))  # sharded gradients: the global norm
    check_norm(norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def check_same_graph(model: torch.nn.Module, inputs: tuple[str, ...]) -> None:
    """ZeRO: stop with a message when ranks are about to forward different input kinds."""
    zero.check_same_graph(model, inputs)


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """All of a sharded model's parameters gathered for the duration (no-op if unsharded).

    Entered by every rank (the gathering is a collective); inside it forwards run no
    collective, so ranks may generate different lengths or only one rank may evaluate. Nested
    use is a no-op.
    """
    if zero.engine_of(model) is not None:
        with zero.gathered(model):
            yield
        return
    if not _is_fsdp(model) or getattr(model, "_mmrft_gathered", False):
        yield
        return
    modules = _fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    model._mmrft_gathered = True  # type: ignore[assignment]
    try:
        yield
    finally:
        model._mmrft_gathered = False  # type: ignore[assignment]
        reshard = bool(getattr(model, "_mmrft_reshard_after_forward", True))
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(reshard, recurse=False)


def gathered_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()``'s names and tensors, read inside :func:`gathered`: the whole
    tensors every rank holds for the duration. FSDP2's ``state_dict()`` would return the
    shards (DTensors) even then, so its parameters and persistent buffers are read from the
    modules directly (tied weights under each name, as ``state_dict()`` lists them);
    otherwise (unsharded, ZeRO, whose gathering swaps the data in place) ``state_dict()``."""
    if "torch.distributed.fsdp" not in sys.modules or not _fsdp_modules(model):
        return model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, param in module.named_parameters(recurse=False, remove_duplicate=False):
            state[dot + name] = param
        for name, buffer in module.named_buffers(recurse=False, remove_duplicate=False):
            if name not in module._non_persistent_buffers_set:
                state[dot + name] = buffer
    return state


def padding_loss(model: torch.nn.Module, pad_token_id: int) -> torch.Tensor:
    """0 × the output of a forward on two padding tokens.

    Run by a rank with fewer micro-batches than another, so that every FSDP unit's all-gather
    (forward) and reduce-scatter (backward) has its partner; its gradient is exactly zero.
    """
    device = next(model.parameters()).device
    ids = torch.full((1, 2), pad_token_id, dtype=torch.long, device=device)
    check_same_graph(model, ())  # ZeRO: other ranks must be text-only too
    out = module_to_call(model)(
        input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1, use_cache=False
    )
    return out.logits.float().sum() * 0.0


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) state dict on CPU on rank 0, ``{}`` on other ranks (a collective);
    None when the model's own parameters are whole already (replicated, ZeRO-2)."""
    if not is_sharded(model):
        return None
    if not _is_fsdp(model):
        return zero.full_model_state(model)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def load_full_model_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool = True
) -> None:
    """Scatter rank 0's full state dict into the shards (other ranks may pass ``{}``);
    ``strict`` False: ``state`` may hold only some of the model's tensors (a LoRA adapter)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, state, options=_options(broadcast_from_rank0=True, strict=strict))


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every optimizer parameter, in ``optimizer.state_dict()``'s index order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """The full optimizer state on rank 0 in ``optimizer.state_dict()``'s layout (states keyed
    by parameter index, full CPU tensors), as an unsharded run saves it; ``{}`` on other ranks.
    A collective when sharded (FSDP2, ZeRO); unsharded, ``optimizer.state_dict()``."""
    if zero.engine_of(model) is not None:
        return zero.full_optimizer_state(model, optimizer)
    if not _is_fsdp(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    if not by_name:
        return {}
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]
    return {"state": {index[n]: v for n, v in by_name["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full ``optimizer.state_dict()``-layout state (any world size wrote it) into the
    optimizer, however it is held. FSDP2: from rank 0 (other ranks may pass ``{}``); ZeRO and
    unsharded: every rank passes the whole state."""
    if zero.engine_of(model) is not None:
        zero.load_full_optimizer_state(model, optimizer, state)
        return
    if not _is_fsdp(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if broadcast_object(is_main() and not state.get("state")):
        # no step was taken before the save: only the hyperparameters. (set_optimizer_state_dict
        # would first fill the state with a zero step, which an unsharded load does not do.)
        groups = broadcast_object(state.get("param_groups") if is_main() else None)
        for group, saved in zip(optimizer.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        return
    by_name: dict[str, Any] = {}
    if is_main():
        names = _parameter_names(model, optimizer)
        by_name = {
            "state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
    set_optimizer_state_dict(model, optimizer, by_name, options=_options(broadcast_from_rank0=True))


def _device() -> torch.device:
    backend = dist.get_backend()
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )

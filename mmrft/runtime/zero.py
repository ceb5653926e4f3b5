"""DeepSpeed ZeRO-2 / ZeRO-3 (``train.sharding: deepspeed_zero2 | deepspeed_zero3``).

mmrft keeps its own update loop (step-wide denominators, one update per rollout batch, summed
gradients; see ``mmrft/runtime/distributed.py``) and hands DeepSpeed only what ZeRO is for: holding
the partitioned fp32 master weights, optimizer states and gradients, the gradient
reduce-scatter, clipping and the optimizer step. How the two fit:

- **Caller-owned gradient accumulation.** The engine is built with
  ``managed_gradient_accumulation: false``: every ``engine.backward`` reduces and partitions
  that micro-batch's gradients (ZeRO-2/3 do so per backward) and ``engine.step()`` is the
  update boundary, however many micro-batches a step has (it varies with dynamic sampling and
  with the zero-advantage completions mmrft skips). ``gradient_accumulation_steps`` is 1 and
  ``engine.backward(..., scale_wrt_gas=False)`` leaves the loss unscaled.
- **Sums, not means.** ZeRO averages gradients over the data-parallel ranks; mmrft's loss
  already carries the denominators of the whole global step, so each rank's loss is
  multiplied by the world size before ``engine.backward`` (Σ_r (W·g_r) / W = Σ_r g_r), and the
  update equals one process on the same global batch.
- **Clipping and the norm.** ``gradient_clipping`` is ``optim.max_grad_norm`` (DeepSpeed
  computes the global norm over the partitions and clips inside ``step``); the norm is read
  back with ``engine.get_global_grad_norm()``, after the step.
- **Precision.** ``model.dtype: bfloat16`` (or float16) turns on DeepSpeed's ``bf16``
  (``fp16``) mode: the module keeps low-precision weights and the optimizer fp32 master
  partitions, as a DeepSpeed user expects. float32 needs neither.
- **Same graph on every rank.** ZeRO-3 all-gathers a module's parameters in its forward
  hook, and ZeRO-2/3 reduce gradients in buckets filled in the order they become ready, so
  every rank must run the same modules in the same order in each pass. mmrft pads ranks with
  fewer micro-batches by repeating one of the rank's own completions with loss × 0 (the same
  media kinds as its real passes), and ``check_same_graph`` compares the media inputs of every
  pass across ranks and stops with a message (instead of a hang or silently mixed gradient
  buckets) when one rank's batch has, say, video and another's only images: such datasets
  need ``train.sharding=fsdp_full``, whose root unit gathers the encoders once per forward
  whatever runs.
- **Generation.** ZeRO-3 parameters are gathered once (``deepspeed.zero.GatheredParameters``)
  and all partitioning hooks are taken off for the duration (TRL's
  ``unwrap_model_for_generation`` removes the per-module ones; the start-of-forward hook must
  go too, its trace check is a collective), so ranks generate different lengths, or rank 0
  evaluates alone, with no collective; ZeRO-2 parameters are whole on every rank already.
- **Checkpoints independent of the world size.** The full weights (ZeRO-3: gathered) and the
  full fp32 optimizer states (``deepspeed.utils.safe_get_full_optimizer_state``) are written
  on rank 0 in exactly the layout of an unsharded run (``save_pretrained`` safetensors,
  ``optimizer.state_dict()`` keyed by parameter index), and read back into the partitions
  (``safe_set_full_optimizer_state``), so a checkpoint resumes on any number of processes,
  with or without DeepSpeed. Weights are loaded into the model before the engine is built,
  so the master weights start from them. Not DeepSpeed's own ``save_checkpoint``: its
  partitioned files tie a checkpoint to the world size that wrote it.
- **The reference model** (β > 0) is partitioned with a ZeRO-3 engine without an optimizer;
  under ZeRO-2 it is replicated (ZeRO-2 partitions only what training holds).

``train.deepspeed`` (a dict) is merged into the ``zero_optimization`` section: CPU offload,
bucket sizes, ``stage3_*`` settings. Launched with ``accelerate launch`` and an accelerate
config of ``distributed_type: DEEPSPEED``, the stage, the offload devices and the
``zero_optimization`` section of ``deepspeed_config_file`` are taken from it
(``distributed.sharding_from_launcher``).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from mmrft.config import RunConfig

log = logging.getLogger("mmrft")

STAGES = {"deepspeed_zero2": 2, "deepspeed_zero3": 3}

# model -> its DeepSpeed engine. Not an attribute of the model: nn.Module.__setattr__ would
# register the engine (which holds the model) as a submodule of the model.
_ENGINES: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_BACKWARDS: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def engine_of(model: torch.nn.Module) -> Any:
    """The DeepSpeed engine that holds ``model``, or None."""
    return _ENGINES.get(model)


def stage_of(model: torch.nn.Module) -> int:
    """The ZeRO stage of ``model``'s engine; 0 when it has none."""
    engine = engine_of(model)
    return int(engine.zero_optimization_stage()) if engine is not None else 0


def deepspeed_config(
    stage: int,
    *,
    micro_batch_size: int,
    world_size: int,
    dtype: str,
    max_grad_norm: float,
    zero: dict[str, Any] | None = None,
    training: bool = True,
) -> dict[str, Any]:
    """The DeepSpeed config mmrft builds (see the module docstring for each choice)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "steps_per_print": 1 << 30,  # mmrft logs its own metrics
        "zero_optimization": {
            # overlap_comm needs side streams that reorder the reductions; mmrft's passes are
            # short micro-batches of one rollout batch, and determinism is worth more here
            "overlap_comm": False,
            "contiguous_gradients": True,
            **(zero or {}),
            "stage": stage,  # train.sharding decides, whatever train.deepspeed says
        },
        "wall_clock_breakdown": False,
    }
    if training:
        config["managed_gradient_accumulation"] = False
        config["gradient_clipping"] = float(max_grad_norm)
        config["zero_allow_untested_optimizer"] = True  # mmrft's torch AdamW (or a test's SGD)
    if dtype in ("bfloat16", "bf16"):
        config["bf16"] = {"enabled": True}
    elif dtype in ("float16", "fp16"):
        config["fp16"] = {"enabled": True}
    return config


def run_deepspeed_config(cfg: RunConfig, world: int, training: bool = True) -> dict[str, Any]:
    """The DeepSpeed config of ``train.sharding`` (deepspeed_zero2/3) and ``train.deepspeed``;
    ``{}`` for other modes."""
    if cfg.train.sharding not in STAGES:
        return {}
    return deepspeed_config(
        STAGES[cfg.train.sharding],
        micro_batch_size=cfg.train.micro_batch_size,
        world_size=world,
        dtype=cfg.model.dtype,
        max_grad_norm=cfg.optim.max_grad_norm,
        zero=cfg.train.deepspeed,
        training=training,
    )


def initialize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    config: dict[str, Any],
) -> Any:
    """Build the engine around ``model`` (and ``optimizer``: None for a frozen reference
    model); the model keeps its identity, its parameters become DeepSpeed's."""
    import deepspeed

    _without_cpu_shm_op()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    if optimizer is None:
        engine.eval()
    _ENGINES[model] = engine
    log.info(
        "%s: DeepSpeed ZeRO-%d over %d ranks",
        "policy" if optimizer is not None else "reference",
        config["zero_optimization"]["stage"],
        dist.get_world_size(),
    )
    return engine


def _without_cpu_shm_op() -> None:
    """On CPU, DeepSpeed's communication backend reduces through gloo instead of its
    shared-memory op (``deepspeed_shm_comm``). That op is compiled on first use in each install
    (about 45 s of two cores), and only speeds DeepSpeed on CPU, which mmrft runs for tiny
    models in tests and smoke runs; GPU accelerators never build it. DeepSpeed keeps its probe
    of compatible ops in one dict that it reads before building (``deepspeed.ops``), so
    marking the op incompatible there is its own switch, not a patch of its code."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def module_to_call(model: torch.nn.Module) -> Any:
    """What a forward must call: the engine (its forward installs the backward hooks ZeRO
    needs), or the model itself when it has none."""
    engine = engine_of(model)
    return engine if engine is not None else model


def backward(model: torch.nn.Module, loss: torch.Tensor) -> None:
    """``loss.backward()``, through the engine when there is one: × world size (ZeRO averages
    over ranks, mmrft's losses are summed) and no scaling by accumulation steps."""
    engine = engine_of(model)
    if engine is None:
        loss.backward()
        return
    engine.backward(loss * dist.get_world_size(), scale_wrt_gas=False)
    _BACKWARDS[model] = _BACKWARDS.get(model, 0) + 1


def step(model: torch.nn.Module) -> float:
    """Clip, step and zero the gradients of the engine's optimizer; the global gradient norm
    before clipping (NaN when DeepSpeed computed none).

    An update with no backward pass on any rank (every advantage 0; ranks pad to the same
    count, so all agree) is skipped, norm 0: a torch optimizer leaves parameters without
    gradients untouched too, and ZeRO cannot finalize gradients that were never produced.
    """
    engine = engine_of(model)
    if not _BACKWARDS.pop(model, 0):
        return 0.0
    engine.step()
    norm = engine.get_global_grad_norm()
    if norm is None:
        return float("nan")
    return float(norm.item() if torch.is_tensor(norm) else norm)


def check_same_graph(model: torch.nn.Module, inputs: tuple[str, ...]) -> None:
    """All ranks must forward the same kinds of inputs in this pass (see the module docstring);
    raise on every rank, naming each rank's inputs, if they do not. A collective."""
    if engine_of(model) is None or dist.get_world_size() == 1:
        return
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, inputs)
    if any(kinds != every[0] for kinds in every):
        shown = "; ".join(f"rank {r}: {', '.join(k) or 'text only'}" for r, k in enumerate(every))
        raise RuntimeError(
            "DeepSpeed ZeRO needs every process to run the same modules in each forward, but "
            f"this pass's inputs differ ({shown}). Batches that mix media kinds across "
            "processes need train.sharding=fsdp_full (or fsdp_grad_op)."
        )


def _partitioning(engine: Any) -> Any:
    """The ZeRO-3 object that holds the parameter hooks."""
    optimizer = engine.optimizer
    return getattr(optimizer, "parameter_offload", None) or optimizer


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """ZeRO-3: every parameter gathered and the partitioning hooks removed for the duration,
    so forwards inside run no collective (generation of different lengths per rank, or
    evaluation on rank 0 alone). Entered by every rank. Anything else: no-op."""
    engine = engine_of(model)
    if engine is None or stage_of(model) != 3:
        yield
        return
    import deepspeed

    partitioning = _partitioning(engine)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        for param in model.parameters():
            param.ds_active_sub_modules.clear()
        # every hook off: the per-module fetch/release hooks and the start-of-forward hook,
        # whose trace check is itself a collective while the trace is incomplete
        partitioning._remove_module_hooks()
        partitioning.forward_hooks, partitioning.backward_hooks = [], []
        try:
            yield
        finally:
            partitioning.setup_zero_stage3_hooks()  # also invalidates the stale module trace


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """ZeRO-3: the full state dict on CPU on rank 0 (``{}`` elsewhere; a collective). ZeRO-2:
    None, the module's own parameters are whole and current on every rank."""
    if stage_of(model) != 3:
        return None
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        if dist.get_rank() != 0:
            return {}
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _flat_partitions(engine: Any) -> list[torch.Tensor]:
    """The fp32 flat partitions the wrapped torch optimizer steps (one per parameter group)."""
    zero = engine.optimizer
    flats = getattr(zero, "single_partition_of_fp32_groups", None)  # ZeRO-1/2
    if flats is None:
        flats = zero.fp32_partitioned_groups_flat  # ZeRO-3
    return list(flats)


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trained parameters in the order the optimizer was built with (its state index)."""
    return [p for p in model.parameters() if p.requires_grad]


def _hyperparameters(optimizer: torch.optim.Optimizer, n: int) -> list[dict[str, Any]]:
    if len(optimizer.param_groups) != 1:
        raise NotImplementedError("DeepSpeed checkpoints: one optimizer parameter group only")
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return [{**group, "params": list(range(n))}]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The full fp32 optimizer state on rank 0 in ``optimizer.state_dict()``'s layout (per
    parameter index: every state tensor at the parameter's shape, and the step count), as an
    unsharded run saves it; ``{}`` on other ranks. A collective (one gather per parameter and
    state). Before the first step there is no state, only the hyperparameters."""
    from deepspeed.utils import safe_get_full_optimizer_state

    engine = engine_of(model)
    params = _trainable(model)
    inner = engine.optimizer.optimizer
    flat_state = inner.state.get(_flat_partitions(engine)[0], {})
    tensor_keys = sorted(k for k, v in flat_state.items() if torch.is_tensor(v) and v.dim() == 1)
    scalars = {k: v for k, v in flat_state.items() if k not in tensor_keys}
    state: dict[int, dict[str, Any]] = {}
    for i, param in enumerate(params):
        entry = {}
        for key in tensor_keys:
            full = safe_get_full_optimizer_state(param, key)
            entry[key] = full.detach().float().cpu().clone()
        entry.update({k: v.clone() if torch.is_tensor(v) else v for k, v in scalars.items()})
        if entry:
            state[i] = entry
    if dist.get_rank() != 0:
        return {}
    return {"state": state, "param_groups": _hyperparameters(optimizer, len(params))}


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Load a full ``optimizer.state_dict()``-layout state (any world size, sharded or not,
    wrote it) into the engine's partitions. Every rank reads the whole state and keeps its
    part; no collective."""
    from deepspeed.utils import lazy_init_hp_params_optimizer_state, safe_set_full_optimizer_state

    engine = engine_of(model)
    for group, hyper in zip(optimizer.param_groups, saved.get("param_groups", [])):
        group.update({k: v for k, v in hyper.items() if k != "params"})
    per_param = saved.get("state") or {}
    if not per_param:
        return  # saved before the first step: there is no state to load
    params = _trainable(model)
    first = next(iter(per_param.values()))
    tensor_keys = [k for k, v in first.items() if torch.is_tensor(v) and v.dim() > 0]
    zero = engine.optimizer
    inner = zero.optimizer
    flats = _flat_partitions(engine)
    for flat in flats:  # the wrapped optimizer's state starts lazily: create it, then fill it
        slot = inner.state[flat]
        for key, value in first.items():
            if key in tensor_keys:
                slot[key] = torch.zeros_like(flat)
            else:
                slot[key] = value.clone() if torch.is_tensor(value) else value
    if hasattr(zero, "bit16_groups"):  # ZeRO-1/2: link each parameter to its state fragments
        for lp_params, flat in zip(zero.bit16_groups, flats):
            lazy_init_hp_params_optimizer_state(lp_params, flat, inner.state)
    for i, param in enumerate(params):
        for key in tensor_keys:
            value = per_param[i][key].to(flats[0].device, torch.float32)
            safe_set_full_optimizer_state(param, value, key)

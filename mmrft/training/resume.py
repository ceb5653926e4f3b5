"""Resuming a run: its directory's name (:func:`run_name`), where its checkpoint is
(:func:`resume_point`, with the guard that refuses a resume under changed settings), a run
already finished, the weights, random state and replica check a resumed run starts from, and
the samples whose media stopped the last run (:func:`skip_failed_media`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from mmrft.config import RunConfig, resolve_path, to_yaml
from mmrft.data import Sample, count_skip
from mmrft.policy.model import Policy, is_lora
from mmrft.rollout.sampling import SampledStream
from mmrft.runtime import distributed
from mmrft.runtime.checkpoint import checkpoint_step, find_resume_checkpoint, set_rng_state
from mmrft.runtime.device import seed_everything
from mmrft.typecheck import ConfigError

log = logging.getLogger("mmrft")


def run_name(cfg: RunConfig) -> str:
    """``<task>__<model>__<seed>`` unless the config names the run."""
    return cfg.name or f"{cfg.task.name}__{Path(cfg.model.path).name}__{cfg.train.seed}"


# Keys a resumed run may change: how long it trains, how it evaluates, logs and checkpoints,
# where and how it is laid out in memory (sharding, chunks, recomputation): none changes what a
# step computes beyond float summation order (a checkpoint resumes on any world size).
RESUME_FREE = (
    "train.steps",
    "train.log_every",
    "train.completions_every",
    "train.heartbeat_s",
    "train.trackers",
    "train.threads",
    "train.micro_batch_size",
    "train.sharding",
    "train.deepspeed",
    "rollout.micro_group",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.kv_cache_gb",
    "rollout.vllm.sleep",
    "model.gradient_checkpointing",
    "eval.",
    "checkpoint.",
    "output_dir",
    "name",
    "device",
    "rollout.batch_size",
    "data.max_test_samples",
    "data.test",
)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return {k.rstrip("."): v for k, v in out.items()}


def config_changes(saved_text: str, cfg: RunConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keys (dotted) where a run's saved ``config.yaml`` (``saved_text``) differs from
    ``cfg``: ``({key: saved value}, {key: value in cfg})``, sorted by key. A key the saved
    run did not know (added to mmrft since) ran as its default then, and counts as such."""
    from mmrft.config import yaml_load

    saved = _flat(yaml_load(saved_text) or {})
    now = _flat(yaml_load(to_yaml(cfg)))
    defaults = _flat(yaml_load(to_yaml(RunConfig())))
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    changed = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    return {k: saved.get(k) for k in changed}, {k: now.get(k) for k in changed}


def resume_point(cfg: RunConfig) -> Path | None:
    """The checkpoint ``cfg`` resumes from (``checkpoint.resume``), checked before anything
    loads: with ``auto`` (or a path) a run whose saved ``config.yaml`` differs from ``cfg`` in
    a key outside :data:`RESUME_FREE` (a key missing there, newer than the run, counts as its
    default) is refused with a :class:`ConfigError` naming each
    changed key and the three ways out; ``force`` resumes all the same."""
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    checkpoint = find_resume_checkpoint(run_dir, cfg.checkpoint.resume)
    saved_file = run_dir / "config.yaml"
    if checkpoint is None or cfg.checkpoint.resume == "force" or not saved_file.is_file():
        return checkpoint
    saved, now = config_changes(saved_file.read_text(encoding="utf-8"), cfg)
    changed = [key for key in saved if not key.startswith(RESUME_FREE)]
    if changed:
        shown = "; ".join(f"{k}: {saved.get(k)!r} → {now.get(k)!r}" for k in changed[:8])
        more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
        raise ConfigError(
            f"checkpoint.resume: {run_dir} has a checkpoint ({checkpoint.name}) made with other "
            f"settings: {shown}{more}. To start over: checkpoint.resume=never; to keep both "
            "runs: a new name=; to continue with the new settings: checkpoint.resume=force"
        )
    return checkpoint


def finished_summary(cfg: RunConfig, checkpoint: Path | None, console: Console) -> dict | None:
    """The saved summary of a run whose checkpoint is already at ``train.steps`` (``None``
    otherwise): a finished run says so and changes nothing."""
    step = checkpoint_step(checkpoint) if checkpoint is not None else None
    if step is None or step < cfg.train.steps:
        return None
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    console.print(
        f"{run_dir} is finished (checkpoint at step {step}, train.steps {cfg.train.steps}); "
        "nothing to do. To train further raise train.steps; to start over "
        "checkpoint.resume=never."
    )
    summary_file = run_dir / "summary.json"
    summary = (
        json.loads(summary_file.read_text())
        if summary_file.is_file()
        else {"run_dir": str(run_dir), "steps": step}
    )
    console.print(f"summary: {json.dumps(summary)}")
    return summary


def load_weights(policy: Policy, checkpoint: Path) -> None:
    """Load a checkpoint's weights into the live policy (LoRA: the adapter; else the model).

    The full model is read back through the family's own loader, so transformers' key
    conversions apply exactly as they do for a user loading the checkpoint.
    """
    if (checkpoint / "adapter").is_dir() and is_lora(policy.model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        adapter = checkpoint / "adapter" / "adapter_model.safetensors"
        if not distributed.is_sharded(policy.model):
            set_peft_model_state_dict(policy.model, load_file(str(adapter)))
            return
        # FSDP2: rank 0 reads the adapter and scatters it into the shards under the model's
        # own names (peft's file leaves out the adapter's name: lora_A.weight for
        # lora_A.default.weight); the frozen base weights stay as model.path loaded them
        full = {}
        if distributed.is_main():
            saved = load_file(str(adapter))
            for name in policy.model.state_dict():
                plain = name.replace(".default.", ".")
                if ".lora_" in name and plain in saved:
                    full[name] = saved.pop(plain)
            if saved:
                raise ValueError(
                    f"{adapter}: tensors the model has no place for: {sorted(saved)[:3]}"
                )
        distributed.load_full_model_state(policy.model, full, strict=False)
        return
    if distributed.is_sharded(policy.model):  # rank 0 reads the checkpoint and scatters it
        full = (
            policy.family.load_model(
                str(checkpoint), dtype=str(policy.model.dtype).removeprefix("torch.")
            ).state_dict()
            if distributed.is_main()
            else {}
        )
        distributed.load_full_model_state(policy.model, full)
        return
    loaded = policy.family.load_model(
        str(checkpoint), dtype=str(policy.model.dtype).removeprefix("torch.")
    )
    policy.model.load_state_dict(loaded.state_dict())


def restore_rng(state: dict[str, Any], cfg: RunConfig, rank: int, world: int) -> None:
    """Each rank's RNG as saved when the world size is unchanged (exact resume); otherwise a
    fresh seed from (seed, step, rank), since the old streams cannot be split or merged."""
    by_rank = state.get("rng_by_rank") or [state["rng"]]
    if len(by_rank) == world:
        set_rng_state(by_rank[rank])
        return
    log.warning(
        "checkpoint written by %d process(es), resuming on %d: sampling streams are reseeded",
        len(by_rank),
        world,
    )
    seed_everything(cfg.train.seed + 1000 * state["step"] + rank)


def check_replicas(policy: Policy, when: str) -> None:
    """Every rank must hold the same parameters (a cheap checksum, compared across ranks).

    Sharded parameters are skipped: each rank holds a different part of one copy, so there
    is no replica to compare.
    """
    if distributed.world_size() == 1 or distributed.is_sharded(policy.model):
        return
    with torch.no_grad():
        checksum = float(sum(p.double().sum().item() for p in policy.model.parameters()))
    sums = distributed.gather_objects(checksum)
    if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"ranks hold different parameters at {when}: checksums {sums}")


def skip_failed_media(
    cfg: RunConfig, run_dir: Path, samples: list[Sample], stream: SampledStream, console: Console
) -> None:
    """After a run stopped on media that failed when drawn (``failure.json``'s ``bad_media``),
    a resume never draws those samples again: each still at its index (same id) joins the
    stream's bad set and is named on the console."""
    failure = run_dir / "failure.json"
    if cfg.checkpoint.resume == "never" or not failure.is_file():
        return
    try:
        bad_media = json.loads(failure.read_text(encoding="utf-8")).get("bad_media") or []
    except (json.JSONDecodeError, AttributeError):
        return
    for bad in bad_media:
        index = bad.get("index")
        if not (isinstance(index, int) and 0 <= index < len(samples)):
            continue
        if samples[index].id != bad.get("id") or index in stream.bad:
            continue
        stream.bad.add(index)
        count_skip("media failed when drawn (failure.json)")
        log.warning("skipped %s (sample %s): named by %s", bad.get("where"), bad["id"], failure)
        console.print(
            f"{failure} stopped the last run on sample {bad['id']} ({bad.get('where')}): "
            "it is skipped from now on",
            highlight=False,
            markup=False,
        )

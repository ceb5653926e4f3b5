"""Resuming a run: its directory's name (:func:`run_name`), where its checkpoint is
(:func:`resume_point`, with the guard that refuses a resume under changed settings), a run
already finished, the weights, random state and replica check a resumed run starts from, and
the samples whose media stopped the last run (:func:`skip_failed_media`), and the run's
history over its processes: ``config.history.yaml`` (:func:`record_start`) and the time totals
each checkpoint carries into ``summary.json`` (:func:`checkpoint_times`, :func:`summary_times`)."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from mmrft.config import REPO_ROOT, RunConfig, resolve_path, to_yaml, yaml_load
from mmrft.data import Sample, count_skip
from mmrft.policy.model import Policy, is_lora, no_weight_bars
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
        full = {}
        if distributed.is_main():
            with no_weight_bars():
                full = policy.family.load_model(
                    str(checkpoint), dtype=str(policy.model.dtype).removeprefix("torch.")
                ).state_dict()
        distributed.load_full_model_state(policy.model, full)
        return
    with no_weight_bars():
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


# ---------------------------------------------------------------------------------------------
# The run's history over its processes

HISTORY_FILE = "config.history.yaml"
MAX_CONFIG_BYTES = 1 << 20  # a run's saved config.yaml larger than this is not read back


def previous_config(run_dir: Path) -> str | None:
    """The text of the run's ``config.yaml`` as the last process left it (read before this
    process overwrites it); ``None`` when there is none, or it is over 1 MiB or not UTF-8."""
    path = run_dir / "config.yaml"
    try:
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _version() -> tuple[str, str | None]:
    """mmrft's version and, from a git checkout, its commit (``None`` when not known)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mmrft")
    except PackageNotFoundError:
        from mmrft import __version__ as found
    commit = None
    if (REPO_ROOT / ".git").exists() and (REPO_ROOT / "mmrft").is_dir():
        try:
            done = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            commit = done.stdout.strip()[:40] if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return found, commit or None


def record_start(
    cfg: RunConfig,
    run_dir: Path,
    previous: str | None,
    world: int,
    checkpoint: Path | None,
    step: int,
) -> str:
    """Append this process's entry to the run's ``config.history.yaml`` (a YAML list: event
    ``start`` or ``resume``, the step resumed from, the checkpoint, UTC time, world size,
    ``checkpoint.resume``, the keys changed against the run's previous ``config.yaml``
    ``{key: {from, to}}``, mmrft's version and commit) and log one line of it to ``train.log``;
    returns that line. A new run (no checkpoint) starts the history over. Rank 0 only."""
    where = f"on {world} process(es)"
    changes: dict[str, Any] | None = {}
    if checkpoint is None:
        line = f"started at step 0 {where}"
    else:
        where = (
            f"from step {step} ({checkpoint}, checkpoint.resume={cfg.checkpoint.resume}) {where}"
        )
        try:
            if not isinstance(yaml_load(previous or ""), dict):
                raise ValueError("not a mapping")
            saved, now = config_changes(previous or "", cfg)
        except Exception as exc:  # the old file may hold anything
            changes = None
            why = "missing" if previous is None else f"unreadable: {exc.__class__.__name__}"
            line = f"resumed {where}; the run's previous config.yaml is {why}, changes unknown"
        else:
            changes = {k: {"from": saved[k], "to": now[k]} for k in saved}
            shown = "; ".join(f"{k}: {saved[k]!r} → {now[k]!r}" for k in saved) or "no change"
            line = f"resumed {where}; config against the run's previous config.yaml: {shown}"
    version, commit = _version()
    entry = {
        "event": "start" if checkpoint is None else "resume",
        "from_step": step,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "world_size": world,
        "resume": cfg.checkpoint.resume,
        "changes": changes,
        "mmrft_version": version,
        "mmrft_commit": commit,
    }
    path = run_dir / HISTORY_FILE
    with path.open("w" if checkpoint is None else "a", encoding="utf-8") as f:
        f.write(_dump([entry]))
    log.info("%s (history: %s)", line, path)
    return line


def _dump(entries: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump(entries, sort_keys=False, allow_unicode=True, default_flow_style=False)


# Time totals (``run``: the :class:`mmrft.training.setup.Run`, typed ``Any`` as setup imports
# this module): each checkpoint's trainer state holds ``times``, the wall-clock seconds of the
# run's processes up to that checkpoint, so a resume from step N adds its own time to what
# led to checkpoint N (a process killed after N is not counted: its steps are redone).
TIME_KEYS = ("train_seconds", "total_seconds")


def saved_times(state: dict[str, Any]) -> dict[str, float] | None:
    """The time totals in a checkpoint's trainer state (``train_seconds``, ``total_seconds``
    ≥ 0, ``processes`` ≥ 1); ``None`` when it has none (written before mmrft kept them, or
    after a resume from such a checkpoint) or they are malformed."""
    times = state.get("times")
    if not isinstance(times, dict):
        return None
    try:
        out = {k: float(times[k]) for k in TIME_KEYS}
        processes = times["processes"]
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in out.values()):
        return None
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        return None
    return {**out, "processes": processes}


def _this_process(run: Any) -> tuple[float, float]:
    """This process's seconds in the RL loop (to its end, or to now while it runs) and since
    set-up began."""
    now = time.perf_counter()
    if run.t_train is None:
        train = 0.0
    elif run.train_seconds is not None:
        train = run.train_seconds
    else:
        train = now - run.t_train
    return train, now - run.t_start


def checkpoint_times(run: Any) -> dict[str, float] | None:
    """The time totals a checkpoint written now carries: the totals of the checkpoint this
    process resumed from (zero for a new run) plus this process's; ``None`` when those are
    unknown."""
    before = run.times_before
    if before is None:
        return None
    train, total = _this_process(run)
    return {
        "train_seconds": before["train_seconds"] + train,
        "total_seconds": before["total_seconds"] + total,
        "processes": int(before["processes"]) + 1,
    }


def summary_times(run: Any) -> dict[str, Any]:
    """``summary.json``'s times, wall-clock seconds: ``train_seconds`` (the RL loops) and
    ``total_seconds`` (set-up to summary) summed over every process of the run up to the
    checkpoint each next one resumed from, ``processes`` counted, what came ``_before_resume``
    and ``_this_process``. After a resume from a checkpoint without totals the sums are
    ``null`` and ``times_note`` says why."""
    before = run.times_before
    train, total = _this_process(run)
    known = before is not None
    out: dict[str, Any] = {
        "train_seconds": round(before["train_seconds"] + train, 1) if known else None,
        "total_seconds": round(before["total_seconds"] + total, 1) if known else None,
        "processes": int(before["processes"]) + 1 if known else None,
        "train_seconds_this_process": round(train, 1),
        "total_seconds_this_process": round(total, 1),
        "train_seconds_before_resume": round(before["train_seconds"], 1) if known else None,
        "total_seconds_before_resume": round(before["total_seconds"], 1) if known else None,
    }
    if not known:
        out["times_note"] = (
            f"resumed from {run.resumed_from}, which holds no time totals (written before "
            "mmrft kept them): the time before it is unknown, so train_seconds, total_seconds "
            "and processes are null; *_this_process cover this process alone"
        )
    return out

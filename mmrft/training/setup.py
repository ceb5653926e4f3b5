"""The set-up of a training run (:func:`setup`): processes, config checks, run directory, task,
reward, model(s), data, engine, optimizer and its LR schedule, collector and logs, held in a
:class:`Run` for the loop (:mod:`.trainer`)."""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from mmrft.config import RunConfig, check_config, config_diff, resolve_path, to_dict, to_yaml
from mmrft.data import Sample, skip_counts
from mmrft.evaluation.evaluate import eval_verifiers
from mmrft.evaluation.harness import build_harness
from mmrft.evaluation.prompt_view import show_prompt
from mmrft.evaluation.report import describe_model, describe_tools
from mmrft.evaluation.runlog import (
    NoSignalWatch,
    RunLog,
    attach_file_log,
    cpu_model,
    detach_file_log,
)
from mmrft.evaluation.tracking import build_trackers
from mmrft.policy.group import check_attention
from mmrft.policy.model import Policy, load_policy
from mmrft.policy.teacher import load_teacher
from mmrft.rewards import judges
from mmrft.rewards.reward import WeightedReward, build_reward
from mmrft.rewards.task import Task
from mmrft.rollout.ahead import AheadCollector, rollout_copy
from mmrft.rollout.base import Engine
from mmrft.rollout.collector import Collector, build_auxiliaries
from mmrft.rollout.engine import build_engine
from mmrft.rollout.preflight import preflight
from mmrft.rollout.sampling import SampledStream, build_sampler
from mmrft.rollout.served_teacher import ServedTeacher
from mmrft.rollout.setup import read_data
from mmrft.runtime import distributed, zero
from mmrft.runtime.device import pick_device, seed_everything
from mmrft.training.resume import previous_config, run_name
from mmrft.training.warm_start import warn_answers_over_budget
from mmrft.typecheck import ConfigError

log = logging.getLogger("mmrft")


@dataclass
class Run:
    """Everything a training run holds between set-up and the end."""

    cfg: RunConfig
    console: Console
    rank: int
    world: int
    run_dir: Path
    task: Task
    reward: WeightedReward
    policy: Policy
    reference: Policy | None
    teacher: Policy | ServedTeacher | None  # on-policy distillation's (teacher.*)
    train_samples: list[Sample]
    test_samples: list[Sample]
    engine: Engine
    collector: Collector | AheadCollector
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: SampledStream
    runlog: RunLog
    t_start: float
    no_signal: NoSignalWatch
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    # per-category results of each evaluation, by its directory name (before, after, step-N)
    categories: dict[str, dict[str, Any]] = field(default_factory=dict)
    resumed_from: Path | None = None
    progress: Progress | None = None  # the RL loop's live progress display, while it runs
    eval_verifiers: Any = None  # eval.verifiers, built at set-up (a bad entry fails there)
    # eval.harness (mmrft.evaluation.harness.Harness), rank 0 only: it evaluates alone
    harness: Any = None
    # checkpoint.keep_best: the best evaluation so far, {"metric", "value", "step"}
    best: dict[str, Any] | None = None
    skipped_before: Counter = field(default_factory=Counter)  # skip_counts() at set-up
    # the run's history (mmrft.training.resume): its config.yaml as the last process left it,
    # the time totals of the processes before this one (None: unknown, an older checkpoint),
    # this process's RL loop clock (perf_counter at its start; its seconds once it ended)
    previous_config: str | None = None
    times_before: dict[str, float] | None = field(
        default_factory=lambda: {"train_seconds": 0.0, "total_seconds": 0.0, "processes": 0}
    )
    t_train: float | None = None
    train_seconds: float | None = None


def setup(cfg: RunConfig, console: Console | None = None) -> Run:
    """Processes, config checks, run directory, task, reward, model(s), data, engine, optimizer,
    collector and logs: everything the loop needs, nothing trained yet. What needs no model is
    checked before the run directory exists (:func:`mmrft.rollout.preflight.preflight`); a
    start-up that fails later removes the run directory it created (a resumed run's stays)."""
    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    created = not run_dir.exists()
    try:
        return _setup(cfg, console)
    except BaseException:
        if created and distributed.is_main() and run_dir.is_dir():
            detach_file_log()
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _setup(cfg: RunConfig, console: Console | None) -> Run:
    t_start = time.perf_counter()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    rank, world = distributed.setup()
    # an accelerate config's FSDP / DeepSpeed settings become train.sharding (mmrft owns the loop)
    cfg.train.sharding, cfg.train.deepspeed = distributed.sharding_from_launcher(
        cfg.train.sharding, cfg.train.deepspeed
    )
    check_config(cfg)
    console = (console or Console()) if rank == 0 else Console(quiet=True)
    if cfg.train.prompts_per_step % world:
        raise ConfigError(
            f"train.prompts_per_step: {cfg.train.prompts_per_step} prompts do not split over {world} processes"
        )
    seed_everything(cfg.train.seed + rank)  # rank 0 draws exactly as a single process would
    device = pick_device(cfg.device)
    task, family = preflight(cfg)

    run_dir = resolve_path(cfg.output_dir) / run_name(cfg)
    previous = None
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        previous = previous_config(run_dir)  # for config.history.yaml, before it is replaced
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        attach_file_log(run_dir / "train.log")
        log.info(
            "machine: %s, torch %s, %d threads",
            cpu_model(),
            torch.__version__,
            torch.get_num_threads(),
        )
    distributed.barrier()
    judges.use_run_dir(run_dir, rank)  # judges' verdicts outlive the process (judge_cache*.jsonl)
    console.rule(f"[bold]mmrft train[/bold] → {escape(str(run_dir))}")
    console.print(
        f"config, what differs from the defaults (all of it: {run_dir / 'config.yaml'}):\n"
        + to_yaml(config_diff(cfg)).rstrip(),
        highlight=False,
        markup=False,
    )

    reward = build_reward(
        cfg.reward.verifiers or task.default_verifiers(),
        cfg.reward.timeout_s,
        cfg.reward.on_timeout,
        cfg.reward.isolation,
        cfg.reward.workers,
        cfg.reward.worker_memory_mb,
    )
    auxiliaries = build_auxiliaries(cfg, reward)  # checked against the verifiers now
    low, high = reward.range
    console.print(
        "reward = "
        + " + ".join(f"{w:g}·{v.name}[{v.spec.low:g},{v.spec.high:g}]" for v, w in reward.verifiers)
        + f"  ∈ [{low:g}, {high:g}]",
        highlight=False,
        markup=False,
    )
    skipped_before = skip_counts()
    train_samples, test_samples = read_data(cfg, task, family)
    sampler = build_sampler(cfg.data.sampler, cfg.data.sampler_params, train_samples)
    policy = load_policy(cfg.model, device, family=family)
    if rank == 0:
        if cfg.name.endswith("-smoke"):  # --smoke cuts every budget to 8 tokens on purpose
            console.print(
                "smoke run: completions are cut at a few tokens on purpose (the pipeline is "
                "checked, not the answers)"
            )
        else:
            for warning in warn_answers_over_budget(
                cfg, policy.tokenizer, task, train_samples, test_samples
            ):
                console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if rank == 0 and (train_samples or test_samples):  # what the model is shown, once
        sample = (train_samples or test_samples)[0]
        shown = show_prompt(policy, task.prompt(sample, family), sample.id)
        console.print(shown, highlight=False, markup=False)
        log.info(shown)
    console.print(run_banner(cfg, policy, task.name, device, world), highlight=False, markup=False)
    distributed.broadcast_parameters(policy.model)
    if cfg.rollout.max_staleness and world > 1 and cfg.rollout.engine == "vllm":
        raise ConfigError(
            "rollout.max_staleness: under several processes the colocated vLLM engine shares "
            "the trainer's process group, which the rollout thread cannot use; use "
            "rollout.engine=hf or vllm_server, or set rollout.max_staleness=0"
        )
    # asynchronous rollouts sample in a thread from a copy of the weights (mmrft.rollout.ahead): for
    # hf a whole copy of the model, made before the policy is sharded; the vLLM engines hold
    # their own
    ahead_copy = cfg.rollout.max_staleness and cfg.rollout.engine == "hf"
    sampler_policy = rollout_copy(policy) if ahead_copy else policy
    distributed.shard_model(policy.model, cfg.train.sharding)
    reference = load_policy(cfg.model, device, trainable=False) if cfg.algorithm.beta > 0 else None
    if reference is not None:  # sharded like the policy, freed after every forward
        distributed.shard_model(
            reference.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=zero.run_deepspeed_config(cfg, world, training=False),
        )
    teacher: Policy | ServedTeacher | None = None
    if cfg.teacher.server.url:
        teacher = ServedTeacher(cfg, policy)
    elif cfg.teacher.path:
        teacher = load_teacher(cfg, policy, device)
    if isinstance(teacher, Policy):  # sharded like the reference
        distributed.shard_model(
            teacher.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=zero.run_deepspeed_config(cfg, world, training=False),
        )
    if cfg.rollout.group_shared:
        try:
            check_attention(policy.model)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    engine = build_engine(
        cfg.rollout,
        sampler_policy,
        model_path=str(resolve_path(cfg.model.path)),
        limits=media_limits(
            train_samples + test_samples,
            cfg.rollout.tools.max_media if cfg.rollout.tools.active else 0,
        ),
        seed=cfg.train.seed + rank,
        keep_media=bool(cfg.teacher.server.url),
    )
    if engine.name != "hf" and train_samples:  # the engine must see the trainer's tokens
        probe = train_samples[:4]
        engine.check_parity([task.prompt(s, family) for s in probe], [s.id for s in probe])
    if cfg.algorithm.tis_cap and not (engine.name != "hf" or cfg.rollout.group_shared):
        raise ConfigError(
            "algorithm.tis_cap: needs an engine that reports its sampling log-probs "
            "(rollout.engine=vllm, or hf with rollout.group_shared=true)"
        )
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    stream = SampledStream(sampler, train_samples, cfg.train.seed, cfg.train.steps, reward.range)
    runlog = RunLog(
        run_dir,
        trackers=build_trackers(
            cfg.train.trackers if rank == 0 else [],
            run_dir,
            run_name(cfg),
            to_dict(cfg),
            cfg.train.wandb_project,
            cfg.train.wandb_mode,
        ),
        enabled=rank == 0,
    )
    collector: Collector | AheadCollector = Collector(
        cfg, task, sampler_policy, engine, reward, train_samples, stream, auxiliaries
    )
    if cfg.rollout.max_staleness:
        collector = AheadCollector(
            collector, policy, cfg.rollout.max_staleness, cfg.rollout.partial_rollouts
        )
    return Run(
        cfg=cfg,
        console=console,
        rank=rank,
        world=world,
        run_dir=run_dir,
        task=task,
        reward=reward,
        policy=policy,
        reference=reference,
        teacher=teacher,
        train_samples=train_samples,
        test_samples=test_samples,
        engine=engine,
        collector=collector,
        optimizer=optimizer,
        scheduler=scheduler,
        stream=stream,
        runlog=runlog,
        t_start=t_start,
        # with a teacher every token has a signal, equal rewards or not
        no_signal=NoSignalWatch(0 if teacher is not None else cfg.train.warn_no_signal_steps),
        eval_verifiers=eval_verifiers(cfg),
        harness=build_harness(cfg) if rank == 0 else None,
        skipped_before=skipped_before,
        previous_config=previous,
    )


def run_banner(cfg: RunConfig, policy: Policy, task: str, device: Any, world: int) -> str:
    """What the run is, shown whether or not it equals a default: model (family, dtype), task,
    device, processes, trainable parameters (of all; LoRA's rank), tools."""
    parameters = list(policy.model.parameters())
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    total = sum(p.numel() for p in parameters)
    lora = f", LoRA r={cfg.model.lora.r}" if cfg.model.lora.enabled else ""
    return (
        f"run: {describe_model(cfg, policy.family.name, task, device)}; "
        f"{world} process{'es' if world > 1 else ''}; trainable parameters "
        f"{trainable:,} of {total:,}{lora}{describe_tools(cfg)}"
    )


def lr_lambda(cfg: RunConfig):
    # counted in optimizer updates: train.steps × algorithm.updates_per_batch
    warmup, schedule = cfg.optim.warmup_steps, cfg.optim.schedule
    total = max(cfg.train.steps * cfg.algorithm.updates_per_batch, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def media_limits(samples: list[Sample], tool_media: int = 0) -> dict[str, int]:
    """The most images, videos and audio clips one sample holds (what an engine reserves),
    each raised by ``tool_media``, the images and clips tools may add to a trajectory."""
    return {
        kind: max((len(s.media(kind)) for s in samples), default=0)
        + (tool_media if kind != "audio" else 0)
        for kind in ("image", "video", "audio")
    }

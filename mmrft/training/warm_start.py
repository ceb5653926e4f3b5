"""The supervised warm start (``warm_start``): steps on ``<answer>reference</answer>``
completions (or scripted tool trajectories) before RL, the KL reference it leaves behind, and
the start-up check that a correct answer fits the token budgets at all."""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from mmrft.config import RunConfig, eval_budget
from mmrft.data import Sample
from mmrft.evaluation.runlog import progress_bar
from mmrft.policy.model import (
    Policy,
    completion_logps,
    is_lora,
    load_policy,
    merged_weights,
    pad_completions,
)
from mmrft.policy.trajectory import Trajectory
from mmrft.rewards.task import Task
from mmrft.rollout.tool_loop import ToolLoop, demonstration_call
from mmrft.runtime import distributed, zero

log = logging.getLogger("mmrft")


def warm_start(
    policy: Policy,
    task: Task,
    samples: list[Sample],
    cfg: RunConfig,
    console: Console,
    tool_loop: ToolLoop | None = None,
) -> list[float]:
    """Supervised steps on ``<answer>reference</answer>`` completions; returns the loss of
    every step (shown on a progress bar as it runs).

    With ``warm_start.demonstrations`` (and the run's ``tool_loop``) a completion is the
    trajectory of a scripted "look closer" policy (:func:`mmrft.rollout.tool_loop.demonstration_call`,
    then the answer), built by the loop's own code, trained on the model's tokens only.

    ``labels="random"`` pairs each prompt with the reference answer of another random sample:
    the model learns the answer *format* and the label distribution, but nothing about the
    image, so the accuracy after the warm start stays at chance and every gain measured across
    RL is RL's. ``labels="target"`` is ordinary SFT.
    """
    ws = cfg.warm_start
    if task.think == "required":
        raise ValueError(
            "warm_start needs task.params.think 'none' or 'optional' (it writes no think block)"
        )
    rng = random.Random(cfg.train.seed + 1)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=ws.lr, weight_decay=0.0)
    end_of_turn = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    references = [task.reference_answer(s) for s in samples]
    losses: list[float] = []
    world, rank = distributed.world_size(), distributed.rank()
    # the random calls' own stream: the batch draws above stay equal on every rank
    call_rng = random.Random(cfg.train.seed * 1000 + 2 + rank)
    if ws.demonstrations and tool_loop is not None and ws.calls == "random":
        check_random_calls(samples, tool_loop)
    if ws.demonstrations and tool_loop is not None and ws.calls == "any":
        check_call_choices(samples, tool_loop)
    with progress_bar(console) as progress:
        bar = progress.add_task("warm start", total=ws.steps, info="")
        for step in range(ws.steps):
            drawn = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
            labels = [rng.randrange(len(samples)) for _ in range(ws.batch_size)]
            share = slice(rank * ws.batch_size // world, (rank + 1) * ws.batch_size // world)
            batch, labels = drawn[share], labels[share]
            answers = [
                references[j] if ws.labels == "random" else references[i]
                for i, j in zip(batch, labels)
            ]
            conversations = [task.prompt(samples[i], policy.family) for i in batch]
            trajectories = None
            choices = [1] * len(batch)  # demonstrations per drawn sample (calls "any": one a place)
            if ws.demonstrations and tool_loop is not None:
                conversations = [
                    tool_loop.with_start(c, samples[i]) for c, i in zip(conversations, batch)
                ]
                demos = [
                    choice_samples(samples[i]) if ws.calls == "any" else [samples[i]] for i in batch
                ]
                choices = [len(d) for d in demos]
                conversations = [c for c, d in zip(conversations, demos) for _ in d]
                trajectories = [
                    tool_loop.demonstration(
                        demo,
                        demonstration_turns(
                            demo, a, tool_loop, call_rng if ws.calls == "random" else None
                        ),
                    )
                    for d, a in zip(demos, answers)
                    for demo in d
                ]
            prepared = policy.family.prepare(
                policy.processor, conversations, add_generation_prompt=True
            )
            rows = policy.family.split_rows(prepared, policy.processor)
            if trajectories is not None:
                completions = [t.ids for t in trajectories]
            else:
                completions = [
                    policy.tokenizer.encode(answer_completion(a), add_special_tokens=False)
                    + [end_of_turn]
                    for a in answers
                ]
            logps, mask, _ = completion_logps(policy, rows, completions, trajectories=trajectories)
            if trajectories is not None:  # the model's own tokens of the trained turns only
                masks = [trained_turns(t, ws.train_on) for t in trajectories]
                loss_mask, _ = pad_completions(masks, 0)
                mask = mask * loss_mask.to(mask.device)
            if max(choices, default=1) > 1:  # calls "any": a sample's places share one call loss
                calls = [trained_turns(t, "calls") for t in trajectories]
                call_mask, _ = pad_completions(calls, 0)
                total, tokens = any_choice_nll(
                    logps, mask, mask * call_mask.to(mask.device), choices
                )
            else:
                total, tokens = -(logps * mask).sum(), mask.sum()
            # mean over every rank's tokens (none: a batch of direct answers under "calls")
            loss = total / max(distributed.sum_scalar(float(tokens)), 1.0)
            loss.backward()
            distributed.sum_gradients(params)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(distributed.sum_scalar(loss.item()))
            recent = float(np.mean(losses[-20:]))
            progress.update(bar, completed=step + 1, info=f"loss {recent:.3f}")
            if (step + 1) % 20 == 0 or step + 1 == ws.steps:
                log.info("warm start %d/%d: loss %.3f", step + 1, ws.steps, recent)
    return losses


def demonstration_turns(
    sample: Sample, answer: str, tool_loop: ToolLoop, rng: random.Random | None = None
) -> list[str]:
    """A scripted trajectory's turn texts: the call on the sample's target when it has one
    (with ``rng``: on a region of its size at a random place), then the answer; with an
    environment, its own scripted episode
    (:attr:`~mmrft.rollout.environment.EnvironmentSpec.demonstration`) for ``answer``."""
    if tool_loop.env is not None and tool_loop.env.spec.demonstration is not None:
        return list(tool_loop.env.spec.demonstration(sample, answer))
    call = demonstration_call(sample, tool_loop.family, sorted(tool_loop.tools), rng)
    return [call, answer_completion(answer)] if call else [answer_completion(answer)]


def choice_samples(sample: Sample) -> list[Sample]:
    """``sample`` once per place it names in ``meta.zoom_choices`` (boxes ``[x1, y1, x2, y2]``
    in pixels of the original image, set as ``meta.zoom_box``; spans ``[start, end]`` in
    seconds, set as ``meta.zoom_span``), so each copy's demonstration calls on one of them
    (``warm_start.calls: any``); ``[sample]`` when it names none."""
    options = sample.meta.get("zoom_choices") or []
    return [
        dataclasses.replace(
            sample, meta={**sample.meta, ("zoom_box" if len(c) == 4 else "zoom_span"): list(c)}
        )
        for c in options
    ] or [sample]


def any_choice_nll(
    logps: torch.Tensor, mask: torch.Tensor, call_mask: torch.Tensor, choices: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed negative log-likelihood, token count) of demonstrations grouped by sample.

    ``logps``, ``mask`` and ``call_mask`` are ``[rows, tokens]``; consecutive runs of
    ``choices[i]`` rows are one sample's demonstrations, one per place it may look. With
    ``S_k`` the log-probability of demonstration k's trained call tokens (``call_mask``) and
    ``A_k`` that of its other trained tokens, a sample adds
    ``-logsumexp_k S_k - mean_k A_k`` (the likelihood that the call is *one of* the places,
    whichever: the format and where one may look, never which place) and
    ``mean_k`` of its trained token count. A run of one row is the plain sum ``-(S + A)``.
    """
    call = (logps * call_mask).sum(-1)
    other = (logps * (mask - call_mask)).sum(-1)
    counts = mask.sum(-1).to(logps.dtype)
    total, tokens, row = logps.new_zeros(()), logps.new_zeros(()), 0
    for k in choices:
        rows = slice(row, row + k)
        calls = torch.logsumexp(call[rows], 0) if call_mask[rows].any() else call[rows].mean()
        total = total - calls - other[rows].mean()
        tokens = tokens + counts[rows].mean()
        row += k
    return total, tokens


def check_call_choices(samples: list[Sample], tool_loop: ToolLoop) -> None:
    """Fail before the first step when ``warm_start.calls: any`` meets a sample with a place
    to look (a scripted call) but no ``meta.zoom_choices``, or choices that are neither boxes
    (4 numbers) nor spans (2): names the count and the first such sample."""
    if tool_loop.env is not None and tool_loop.env.spec.demonstration is not None:
        return  # the environment scripts its own episodes
    tools = sorted(tool_loop.tools)
    failures = []
    for sample in samples:
        options = sample.meta.get("zoom_choices") or []
        if any(len(c) not in (2, 4) for c in options):
            failures.append(f"sample {sample.id!r}: zoom_choices must be boxes or spans")
        elif not options and demonstration_call(sample, tool_loop.family, tools) is not None:
            failures.append(f"sample {sample.id!r} has a target but no meta.zoom_choices")
    if failures:
        raise ValueError(
            f"warm_start.calls: any: {len(failures)} of {len(samples)} training samples "
            f"name no places to choose from; first: {failures[0]}"
        )


def check_random_calls(samples: list[Sample], tool_loop: ToolLoop) -> None:
    """Fail before the first step when a sample cannot have a random demonstration call
    (``warm_start.calls: random``): a clip with no ``meta.duration`` would otherwise keep its
    target window, a silent leak of where to look. Names the count and the first such sample."""
    if tool_loop.env is not None and tool_loop.env.spec.demonstration is not None:
        return  # the environment scripts its own episodes
    probe = random.Random(0)
    failures = []
    for sample in samples:
        try:
            demonstration_call(sample, tool_loop.family, sorted(tool_loop.tools), probe)
        except ValueError as error:
            failures.append(str(error))
    if failures:
        raise ValueError(
            f"warm_start.calls: random: {len(failures)} of {len(samples)} training samples "
            f"cannot have a random call; first: {failures[0]}"
        )


def trained_turns(trajectory: Trajectory, train_on: str) -> list[int]:
    """The loss mask of a demonstration under ``warm_start.train_on``: its ``loss_mask`` (the
    model's tokens) kept on every turn (``"all"``), the last turn only (``"answer"``) or every
    turn but the last (``"calls"``)."""
    last = len(trajectory.turns) - 1
    keep: list[int] = []
    for i, turn in enumerate(trajectory.turns):
        on = train_on == "all" or (i == last) == (train_on == "answer")
        keep += [int(on)] * (turn.tokens + turn.observation_tokens)
    keep += [0] * (len(trajectory.ids) - len(keep))
    return [m * k for m, k in zip(trajectory.loss_mask, keep)]


def answer_completion(reference: str) -> str:
    """The shortest correct completion for a reference answer, before the end-of-turn token:
    ``<answer>reference</answer>`` (what the warm start trains on)."""
    return f"<answer>{reference}</answer>"


def answers_over_budget(
    tokenizer: Any, task: Task, samples: list[Sample], max_new_tokens: int
) -> tuple[int, int]:
    """(how many, longest): samples whose shortest correct completion (:func:`answer_completion`
    and the end-of-turn token) is longer than ``max_new_tokens`` tokens. Such a sample can never
    earn the full reward (it is cut off before the answer closes), which no training curve shows
    by itself: the tiny detection recipe lost every 3- and 4-box image to a 112-token budget
    this way. (0, 0) for a task without reference answers."""
    texts = []
    for sample in samples:
        try:
            texts.append(answer_completion(task.reference_answer(sample)))
        except NotImplementedError:
            return 0, 0
        except Exception:  # a check, not a gate: a sample it cannot phrase is not counted
            continue
    if not texts:
        return 0, 0
    lengths = [len(ids) + 1 for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return sum(n > max_new_tokens for n in lengths), max(lengths)


def warn_answers_over_budget(
    cfg: RunConfig,
    run_tokenizer: Any,
    task: Task,
    train_samples: list[Sample],
    test_samples: list[Sample],
) -> list[str]:
    """The start-up warnings of :func:`answers_over_budget` for the rollout and evaluation
    budgets, each naming the key to raise; logged and returned."""
    warnings = []
    checks = [
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens, train_samples, "training"),
        (
            "eval.max_new_tokens" if cfg.eval.max_new_tokens else "rollout.max_new_tokens",
            eval_budget(cfg),
            test_samples,
            "test",
        ),
    ]
    for key, budget, samples, split in checks:
        over, longest = answers_over_budget(run_tokenizer, task, samples, budget)
        if over:
            warnings.append(
                f"{key}={budget}: {over} of {len(samples)} {split} samples need more tokens for "
                f"a correct answer alone (the longest {longest}); they cannot earn full reward "
                f"or a correct evaluation. Raise {key} to at least {longest}."
            )
            log.warning(warnings[-1])
    return warnings


REFERENCE_FILE = "reference.safetensors"


def warm_started_reference(
    cfg: RunConfig, policy: Policy, run_dir: Path, rank: int, world: int, load: bool
) -> Policy:
    """The KL reference after a warm start: a frozen copy of the warm-started policy, the model
    RL starts from (the papers' reference is the SFT model RL begins with). The reference read
    from ``model.path`` would be the model *before* the warm start: KL to it pulls the policy
    back to not writing the answer format at all.

    After the warm start (``load`` False) rank 0 writes its weights to
    ``run_dir/reference.safetensors`` (the plain model's tensors, LoRA merged in, so any
    sharding mode reads it back); a resumed run (``load`` True) reads them back on every rank,
    so the reference is the same model after a resume. Unsharded without LoRA, every rank
    copies its own policy (identical on every rank), never reading a file rank 0 may still be
    writing. Otherwise the policy's full weights are gathered to rank 0 (a collective when
    sharded), merged and written, and every rank loads the file into a fresh frozen model from
    ``model.path``, sharded like the one it replaces.
    """
    import copy

    from safetensors.torch import load_model, save_model

    path = run_dir / REFERENCE_FILE
    lora = is_lora(policy.model)
    if cfg.train.sharding == "none" and not lora:
        model = copy.deepcopy(policy.model).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        if load:
            load_model(model, str(path))
        elif rank == 0:
            save_model(model, str(path))
        return Policy(policy.family, model, policy.processor)
    reference = load_policy(cfg.model, policy.device, trainable=False)
    if not load:
        weights = distributed.full_model_state(policy.model)  # collective: rank 0's is full
        if weights is None:  # unsharded or ZeRO-2: every rank's parameters are whole already
            weights = policy.model.state_dict() if rank == 0 else {}
        if rank == 0:  # written as the unsharded path writes it (tied weights once)
            if lora:
                weights = dict(merged_weights(policy.model, weights))
            reference.model.load_state_dict(weights)
            save_model(reference.model, str(path))
        del weights
        distributed.barrier()
    load_model(reference.model, str(path))
    distributed.shard_model(
        reference.model,
        cfg.train.sharding,
        frozen=True,
        deepspeed_config=zero.run_deepspeed_config(cfg, world, training=False),
    )
    return reference

"""Sharded training (``train.sharding``: FSDP2, and DeepSpeed ZeRO-2/3) trains like one process.

Two processes (gloo on CPU) shard the policy (and the reference model) with FSDP2 or DeepSpeed
ZeRO, train two RL steps on their parts of a global batch and must end with the parameters and
optimizer state one unsharded process reaches on the whole batch. The ranks get unequal work
(3 groups against 1, and zero-advantage completions skipped), so the padding passes that keep
the collectives paired run too. ``fsdp_full`` / ``deepspeed_zero3`` clip the gradients (the
demo's max_grad_norm 1 is far below the norm), which checks the clipping of sharded gradients;
``fsdp_grad_op`` / ``deepspeed_zero2`` do not, so the update shows the gradient's scale (a sum
over ranks, not a mean); all compare the gradient norms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks import free_port, run_ranks
from test_distributed import rank_batch

REPO = Path(__file__).resolve().parents[1]

BASE = [
    "warm_start.steps=0",  # these checks compare RL updates alone
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "train.micro_batch_size=3",  # several micro-batches per rank
    "algorithm.clip_low=0.05",
    "algorithm.clip_high=0.05",
    "optim.lr=1e-2",
    "algorithm.beta=0",  # the demo's KL term needs a reference model these checks do not build
]
CASES = {
    # ZeRO-3 with a sharded reference model (β > 0: stored reference log-probs, all completions
    # forwarded) and μ = 2 (stored old log-probs): no-grad passes are padded too
    "fsdp_full": [
        *BASE,
        "train.sharding=fsdp_full",
        "algorithm.beta=0.04",
        "algorithm.updates_per_batch=2",
    ],
    # ZeRO-2 with zero-advantage completions skipped, gradient checkpointing and no clipping
    # (so that the scale of the gradient, a sum over ranks, shows in the update)
    "fsdp_grad_op": [
        *BASE,
        "train.sharding=fsdp_grad_op",
        "model.gradient_checkpointing=true",
        "optim.max_grad_norm=0",
        "optim.lr=1e-3",
    ],
    # the same two cases through DeepSpeed's engine (a ZeRO-3 reference model without optimizer)
    "deepspeed_zero3": [
        *BASE,
        "train.sharding=deepspeed_zero3",
        "algorithm.beta=0.04",
        "algorithm.updates_per_batch=2",
    ],
    "deepspeed_zero2": [
        *BASE,
        "train.sharding=deepspeed_zero2",
        "model.gradient_checkpointing=true",
        "optim.max_grad_norm=0",
        "optim.lr=1e-3",
    ],
    "fsdp_full_lora": [
        *BASE,
        "train.sharding=fsdp_full",
        "model.lora.enabled=true",
        "algorithm.beta=0.04",
        "algorithm.updates_per_batch=2",
    ],
    "deepspeed_zero3_lora": [
        *BASE,
        "train.sharding=deepspeed_zero3",
        "model.lora.enabled=true",
        "algorithm.beta=0.04",
        "algorithm.updates_per_batch=2",
    ],
    "fsdp_grad_op_lora": [
        *BASE,
        "train.sharding=fsdp_grad_op",
        "model.lora.enabled=true",
        "model.gradient_checkpointing=true",
        "optim.max_grad_norm=0",
        "optim.lr=1e-3",
    ],
    # on-policy distillation with a sharded teacher (the model's own checkpoint: the KL is 0
    # at step 1 and not at step 2): the per-token estimate with μ = 2, and the full KL, whose
    # teacher pass runs beside every forward/backward (padded like it)
    "fsdp_full_teacher": [
        *BASE,
        "train.sharding=fsdp_full",
        f"teacher.path={REPO / 'assets/models/tiny-qwen2_5_vl'}",
        "algorithm.updates_per_batch=2",
    ],
    "deepspeed_zero3_teacher_full": [
        *BASE,
        "train.sharding=deepspeed_zero3",
        f"teacher.path={REPO / 'assets/models/tiny-qwen2_5_vl'}",
        "algorithm.distill_loss=full",
    ],
    "deepspeed_zero2_lora": [
        *BASE,
        "train.sharding=deepspeed_zero2",
        "model.lora.enabled=true",
        "model.gradient_checkpointing=true",
        "optim.max_grad_norm=0",
        "optim.lr=1e-3",
    ],
}
GROUPS = 4
SHARES = [[0, 1, 2], [3]]  # groups per rank (of 2): unequal on purpose


def train_two_steps(overrides: list[str], world: int, rank: int) -> dict[str, torch.Tensor]:
    """Two RL steps on a fixed global batch (this rank's groups of it); the full parameters
    and SGD momentum buffers (rank 0: all; other ranks: empty)."""
    from mmrft.algorithms import group_advantages
    from mmrft.config import load_config
    from mmrft.policy.model import load_policy
    from mmrft.rewards.task import build_task
    from mmrft.rollout.base import Sampling
    from mmrft.rollout.hf import HFEngine
    from mmrft.runtime import distributed
    from mmrft.runtime.zero import run_deepspeed_config
    from mmrft.training.setup import lr_lambda
    from mmrft.training.update import grpo_update

    torch.set_num_threads(1)
    if world == 1:
        overrides = [*overrides, "train.sharding=none"]
    cfg = load_config(REPO / "configs/demo.yaml", overrides)
    G = cfg.rollout.group_size
    task = build_task(cfg.task.name, cfg.task.params)
    torch.manual_seed(0)  # LoRA's A matrices start random: the same on every process
    policy = load_policy(cfg.model, torch.device("cpu"))
    fsdp = cfg.train.sharding.startswith("fsdp")
    assert distributed.shard_model(policy.model, cfg.train.sharding) == (world > 1 and fsdp)
    reference = None
    if cfg.algorithm.beta > 0:
        reference = load_policy(cfg.model, torch.device("cpu"), trainable=False)
        distributed.shard_model(
            reference.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=run_deepspeed_config(cfg, world, training=False),
        )
    teacher = None  # on-policy distillation's, sharded like the reference
    if cfg.teacher.path:
        from mmrft.policy.teacher import load_teacher

        teacher = load_teacher(cfg, policy, torch.device("cpu"))
        distributed.shard_model(
            teacher.model,
            cfg.train.sharding,
            frozen=True,
            deepspeed_config=run_deepspeed_config(cfg, world, training=False),
        )
    samples, _ = task.read(REPO / cfg.data.train)
    samples = samples[:GROUPS]
    for s in samples:
        policy.family.annotate(s)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    # SGD (with momentum: still linear in the gradient): what is compared is the summed,
    # clipped gradient. AdamW would turn float-rounding differences of tiny gradients into
    # update differences of ~1e-4 (it divides them by their own tiny scale).
    optimizer = torch.optim.SGD(params, lr=cfg.optim.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    distributed.prepare_optimizer(
        policy.model, optimizer, cfg.train.sharding, run_deepspeed_config(cfg, world)
    )
    engine = HFEngine(policy, batch_size=64)
    expanded = [s for s in samples for _ in range(G)]
    groups = SHARES[rank] if world > 1 else range(GROUPS)
    share = [g * G + i for g in groups for i in range(G)]
    norms, sampled = [], []
    for step in (1, 2):
        torch.manual_seed(step)  # every process samples the same global batch
        with distributed.gathered(policy.model):
            rollouts = engine.generate(
                [task.prompt(s, policy.family) for s in samples], G, Sampling(6)
            )
        # a reward that varies within every group, whatever the model writes
        rewards = torch.tensor([sum(c) % 11 / 10 for c in rollouts.completion_ids])
        rewards[2 * G : 3 * G] = 0.5  # group 2 (rank 0's): zero advantages, skipped if β = 0
        advantages = group_advantages(rewards, G)
        batch = rank_batch(expanded, rollouts, rewards, share)
        stats = grpo_update(
            policy, reference, optimizer, scheduler, batch, advantages[share], cfg, step, teacher
        )
        norms.append(stats["grad_norm"])
        sampled.append([t for ids in rollouts.completion_ids for t in ids])
    # only rank 0 generates, as evaluation does: no collective may run inside generate
    with distributed.gathered(policy.model):
        if distributed.is_main():
            engine.generate([task.prompt(samples[0], policy.family)], 2, Sampling(6))
    if world > 1:
        weights = distributed.full_model_state(policy.model)
        if weights is None:  # ZeRO-2: the parameters are whole on every rank; rank 0's
            own = policy.model.state_dict()
            weights = {k: v.detach().clone() for k, v in own.items()} if rank == 0 else {}
        momentum = distributed.full_optimizer_state(policy.model, optimizer)
        if not fsdp:  # DeepSpeed: the full state loads back into the right partitions
            _check_optimizer_state_round_trip(policy.model, optimizer, momentum)
    else:
        weights = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        momentum = optimizer.state_dict()
    if not weights:
        return {}  # ranks > 0: the full state lives on rank 0 only
    out = {**weights, "grad_norm": torch.tensor(norms, dtype=torch.float64)}
    for step, tokens in enumerate(sampled, 1):
        out[f"sampled/{step}"] = torch.tensor(tokens)
    for index, state in momentum.get("state", {}).items():
        out[f"momentum/{index}"] = state["momentum_buffer"]
    return out


def _check_optimizer_state_round_trip(model, optimizer, saved: dict) -> None:
    """Wipe the engine's partitioned optimizer state, load the full state every rank got from
    rank 0, and read it back: equal, parameter by parameter (a wrong fragment offset or
    partition would move values between parameters or ranks)."""
    from mmrft.runtime import distributed, zero

    saved = distributed.broadcast_object(saved)
    inner = zero.engine_of(model).optimizer.optimizer
    for slot in inner.state.values():
        for value in slot.values():
            if torch.is_tensor(value) and value.dim() == 1:
                value.normal_()
    distributed.load_full_optimizer_state(model, optimizer, saved)
    again = distributed.full_optimizer_state(model, optimizer)
    if distributed.is_main():
        assert again["state"].keys() == saved["state"].keys()
        for index, state in saved["state"].items():
            torch.testing.assert_close(again["state"][index], state, rtol=0, atol=0)


def _worker(rank: int, world: int, overrides: list[str], out_dir: str) -> None:
    torch.save(train_two_steps(overrides, world, rank), Path(out_dir) / f"rank{rank}.pt")


SLOW = {
    "fsdp_grad_op_lora",
    "deepspeed_zero2_lora",
    # ~21 s of two cores: LoRA under sharding stays in the default run through fsdp_full_lora,
    # ZeRO-3 through deepspeed_zero3_teacher_full
    "deepspeed_zero3_lora",
    "fsdp_full_teacher",  # deepspeed_zero3_teacher_full covers the teacher's sharded passes
    # full-parameter ZeRO-3 training: deepspeed_zero3_teacher_full; its sharded reference model
    # with μ = 2: deepspeed_zero3_lora
    "deepspeed_zero3",
}  # their full twins and fsdp_full_lora cover them


def _needs(case: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.slow] if case in SLOW else []
    if not case.startswith("deepspeed"):
        return marks
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return [pytest.mark.skip(reason="DeepSpeed not installed (pip install mmrft[deepspeed])")]
    return marks


def assert_sharded_equals_single(
    overrides: list[str], tmp_path: Path, clip_must_act: bool = True
) -> None:
    """Two sharded processes (``overrides`` set train.sharding) end with the weights, optimizer
    state and gradient norms of one unsharded process on the whole batch. ``clip_must_act``:
    the demo model's gradient norms exceed optim.max_grad_norm (the clip of sharded gradients
    is checked); other models' may not."""
    from mmrft.config import load_config
    from mmrft.policy.model import load_policy

    run_ranks(_worker, overrides, str(tmp_path))
    sharded = torch.load(tmp_path / "rank0.pt")
    assert torch.load(tmp_path / "rank1.pt") == {}  # the full state lives on rank 0 only
    single = train_two_steps(overrides, 1, 0)
    # parameters no forward used (an audio encoder on images): one process leaves their
    # gradient None and SGD makes no state; several processes reduce zeros for them (every
    # rank must take part), so their momentum exists and is zero
    for key in sharded.keys() - single.keys():
        assert key.startswith("momentum/") and not sharded.pop(key).any(), key
    assert sharded.keys() == single.keys(), sorted(single.keys() - sharded.keys())[:6]
    assert any(k.startswith("momentum/") for k in single)
    for step in (1, 2):  # the same global batch (else the updates cannot be compared)
        assert torch.equal(sharded.pop(f"sampled/{step}"), single.pop(f"sampled/{step}")), step
    norms = single.pop("grad_norm")
    torch.testing.assert_close(sharded.pop("grad_norm"), norms, rtol=1e-5, atol=0)
    cfg = load_config(REPO / "configs/demo.yaml", overrides)
    max_norm = cfg.optim.max_grad_norm
    assert not clip_must_act or max_norm == 0 or (norms > max_norm).all()  # the clip acted
    worst = 0.0
    for key, value in single.items():
        torch.testing.assert_close(
            sharded[key], value, rtol=0, atol=1e-5, msg=f"2 sharded ranks ≠ 1 process at {key}"
        )
        worst = max(worst, float((sharded[key] - value).abs().max()))
    print(f"{overrides}: max |2 sharded processes − 1 process| = {worst:.2e}")

    torch.manual_seed(0)  # the LoRA initialisation train_two_steps starts from
    initial = load_policy(cfg.model, torch.device("cpu")).model.state_dict()
    assert any(not torch.equal(initial[k], single[k]) for k in initial), "nothing trained"


@pytest.mark.parametrize("case", [pytest.param(c, marks=_needs(c)) for c in CASES])
def test_two_sharded_processes_match_one_process(case, tmp_path):
    assert_sharded_equals_single(CASES[case], tmp_path)


FAMILIES = (
    "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen2_5_omni",
    "qwen3_omni", "internvl", "gemma3", "gemma4", "glm4v",
)  # fmt: skip
DEFAULT_RUN = {("qwen3_5", "fsdp_full", "lora")}  # the prefix path's padding, LoRA's order


def _family_case(family: str, mode: str, held: str) -> Any:
    marks = _needs(mode) + ([] if (family, mode, held) in DEFAULT_RUN else [pytest.mark.slow])
    return pytest.param(family, mode, held, marks=marks, id=f"{family}-{mode}-{held}")


@pytest.mark.parametrize(
    "family, mode, held",
    [
        _family_case(f, m, h)
        for f in FAMILIES
        for m in ("fsdp_full", "deepspeed_zero3")
        for h in ("full", "lora")
    ],
)
def test_every_family_shards_like_one_process(family, mode, held, tmp_path):
    """Each family's tiny model (its own encoders, DeepStack, MoE, recurrent layers, tiles)
    under FSDP2 and ZeRO-3, all weights or LoRA: two sharded processes equal one process."""
    # μ = 1: with a second update per batch the clipped ratio is discontinuous, and float
    # summation order (one process vs two) moved a ratio across the clip on tiny Gemma 3
    overrides = [
        *CASES[mode],
        f"model.path={REPO}/assets/models/tiny-{family}",
        "algorithm.updates_per_batch=1",
    ]
    if held == "lora":
        overrides.append("model.lora.enabled=true")
    assert_sharded_equals_single(overrides, tmp_path, clip_must_act=False)


def test_sharding_mode_is_validated():
    import typing

    from mmrft.config import TrainConfig, load_config
    from mmrft.runtime.distributed import SHARDING
    from mmrft.typecheck import ConfigError

    hint = typing.get_type_hints(TrainConfig)["sharding"]
    assert typing.get_args(hint) == SHARDING

    with pytest.raises(ConfigError, match=r"train\.sharding.*did you mean 'fsdp_full'"):
        load_config(REPO / "configs/demo.yaml", ["train.sharding=fsdp"])
    for mode in SHARDING:  # LoRA trains under every mode
        load_config(
            REPO / "configs/demo.yaml", [f"train.sharding={mode}", "model.lora.enabled=true"]
        )


def test_shard_units_are_the_text_decoder_layers():
    """Media encoders run 0, 1 or 2 times per forward depending on the batch, so their blocks
    must not be units of their own (an all-gather per call would not pair up across ranks)."""
    from mmrft.config import load_config
    from mmrft.policy.model import load_policy
    from mmrft.runtime.distributed import shard_units

    for name in ("tiny-qwen2_5_vl", "tiny-qwen2_audio", "tiny-qwen2_5_omni"):
        cfg = load_config(REPO / "configs/demo.yaml", [f"model.path=assets/models/{name}"])
        model = load_policy(cfg.model, torch.device("cpu")).model
        units = shard_units(model)
        decoder_layers = list(model.get_decoder().layers)
        assert units == decoder_layers, name


def torchrun(tmp_path: Path, nproc: int, steps: int, extra: list[str]) -> None:
    """``mmrft train demo`` on ``nproc`` processes through torchrun; ``nproc`` = 1: the same
    command in this process (no process group; a start-up of torch and transformers saved)."""
    args = [
        "train", "demo", f"output_dir={tmp_path}", "name=ws",
        "warm_start.steps=2", f"train.steps={steps}", "train.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=6", "eval.before=false", "eval.every=3", "eval.batch_size=20",
        "data.max_test_samples=4", "checkpoint.every=1", "train.threads=1",
        "algorithm.beta=0",
        *extra,
    ]  # fmt: skip
    if nproc == 1:
        from mmrft.cli import main

        assert main(args) == 0
        return
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    cmd = [*launch, f"--master_port={free_port()}", "-m", "mmrft.cli", *args]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "returned a view tensor" not in result.stderr  # FSDP2's false alarm, filtered


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("fsdp_full"),
        # ZeRO-2 writes and loads the full optimizer state through the same functions as ZeRO-3
        # (distributed.full_optimizer_state / load_full_optimizer_state) and its weights are
        # never partitioned: ~40 s of two cores, with -m slow
        pytest.param("deepspeed_zero2", marks=[pytest.mark.slow, *_needs("deepspeed_zero2")]),
        # ~50 s of two cores: with -m slow; the default run keeps DeepSpeed's full optimizer
        # state written and loaded back (test_two_sharded_processes_match_one_process's round
        # trip) and the resume across world sizes through FSDP2 (fsdp_full, here)
        pytest.param("deepspeed_zero3", marks=[pytest.mark.slow, *_needs("deepspeed_zero3")]),
    ],
)
def test_sharded_checkpoints_resume_on_any_world_size(mode, tmp_path):
    """2 sharded processes warm-start and write step 2; 1 unsharded process resumes it to
    step 3; 2 sharded processes resume that to step 4. Every checkpoint is a plain
    save_pretrained directory. The evaluation at step 3 generates on rank 0 alone (no
    collective may run inside). The KL reference is the warm-started model, gathered from
    the shards, written once and read back by every resume."""
    # the entropy bonus and the KL term (a sharded reference model) give every step a
    # gradient even where the rewards are all equal, so each step moves the weights and the
    # optimizer state
    sharded = [
        f"train.sharding={mode}",
        "algorithm.entropy_coef=0.01",
        "algorithm.beta=0.04",
    ]
    torchrun(tmp_path, 2, steps=2, extra=sharded)
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    # the reference is the warm-started policy: at step 1, before any RL update, KL = 0
    lines = [json.loads(x) for x in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in lines if m.get("step") == 1 and "train/kl" in m)
    assert first["train/kl"] < 1e-6
    reference = load_file(tmp_path / "ws" / "reference.safetensors")
    initial = AutoModelForImageTextToText.from_pretrained(REPO / "assets/models/tiny-qwen2_5_vl")
    weights = initial.state_dict()  # tied weights are written once
    moved = [k for k, v in reference.items() if not torch.equal(weights[k], v)]
    assert moved, "the reference is model.path's model, not the warm-started one"

    step2 = tmp_path / "ws" / "checkpoints" / "step-000002"
    state = torch.load(step2 / "trainer_state.pt", weights_only=False)
    assert state["world_size"] == 2
    adam = state["optimizer"]["state"]
    assert all(isinstance(k, int) for k in adam)  # the unsharded layout, full tensors:
    model = AutoModelForImageTextToText.from_pretrained(step2)
    params = list(model.parameters())
    assert [adam[i]["exp_avg"].shape for i in range(len(params))] == [p.shape for p in params]
    torchrun(tmp_path, 1, steps=3, extra=sharded[1:])
    torchrun(tmp_path, 2, steps=4, extra=sharded)
    lines = [json.loads(x) for x in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/reward" in m] == [1, 2, 3, 4]
    log = (tmp_path / "ws" / "train.log").read_text()
    assert "resuming on 1" in log and "resuming on 2" in log
    final = tmp_path / "ws" / "checkpoints" / "step-000004"
    model = AutoModelForImageTextToText.from_pretrained(final)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"


@pytest.mark.parametrize(
    "mode",
    [
        # ~33 s of two cores (three launches): with -m slow. The default run keeps a resume
        # across world sizes (test_sharded_checkpoints_resume_on_any_world_size[fsdp_full]) and
        # sharded LoRA equal to one process (test_two_sharded_processes_match_one_process
        # [fsdp_full_lora]), not this test's adapter scattered back into the shards
        pytest.param("fsdp_full", marks=pytest.mark.slow),
        pytest.param("deepspeed_zero3", marks=[pytest.mark.slow, *_needs("deepspeed_zero3")]),
    ],
)
def test_sharded_lora_checkpoints_merge_and_resume(mode, tmp_path):
    """LoRA under sharding: 2 sharded processes warm-start (the KL reference is the merged
    warm-started policy) and write step 2; 1 unsharded process resumes it to step 3 (the
    adapter loads, the reference file reads back); 2 sharded processes resume to step 4 (rank 0
    scatters the adapter into the shards). Each checkpoint's model is exactly peft's merge of
    its own adapter into model.path's weights, and the frozen base weights never moved."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    lora = ["model.lora.enabled=true", "algorithm.entropy_coef=0.01", "algorithm.beta=0.04"]
    lora.append("checkpoint.keep_last=3")
    torchrun(tmp_path, 2, steps=2, extra=[f"train.sharding={mode}", *lora])
    torchrun(tmp_path, 1, steps=3, extra=lora)
    torchrun(tmp_path, 2, steps=4, extra=[f"train.sharding={mode}", *lora])
    lines = [json.loads(x) for x in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "train/reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert steps[0]["train/kl"] < 1e-6 < steps[1]["train/kl"]  # the reference: step 1's policy
    log = (tmp_path / "ws" / "train.log").read_text()
    assert "resuming on 1" in log and "resuming on 2" in log

    base_path = REPO / "assets/models/tiny-qwen2_5_vl"
    base = AutoModelForImageTextToText.from_pretrained(base_path).state_dict()
    reference = load_file(tmp_path / "ws" / "reference.safetensors")
    assert reference.keys() <= base.keys()  # a plain model's tensors, merged
    assert any(not torch.equal(reference[k], base[k]) for k in reference)
    adapters = []
    for step in (2, 3, 4):
        checkpoint = tmp_path / "ws" / "checkpoints" / f"step-{step:06d}"
        saved = AutoModelForImageTextToText.from_pretrained(checkpoint).state_dict()
        fresh = AutoModelForImageTextToText.from_pretrained(base_path)
        merged = PeftModel.from_pretrained(fresh, checkpoint / "adapter").merge_and_unload()
        expected = merged.state_dict()
        assert saved.keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(saved[key], value, rtol=0, atol=1e-6, msg=key)
        adapters.append(load_file(checkpoint / "adapter" / "adapter_model.safetensors"))
    moved = [k for k in adapters[0] if not torch.equal(adapters[0][k], adapters[2][k])]
    assert moved, "the adapter did not train after the resumes"


def _accelerate_env(path: Path) -> dict[str, str]:
    """The environment ``accelerate launch --config_file PATH`` gives each process (accelerate's
    own parsing and environment preparation, without starting any process)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    if not args.use_deepspeed:
        return prepare_multi_gpu_env(args)
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    return prepare_deepspeed_cmd_env(args)[1]


@pytest.mark.parametrize(
    "name, sharding",
    [
        ("multi_gpu", "none"),
        ("fsdp2", "fsdp_full"),
        ("deepspeed_zero2", "deepspeed_zero2"),
        ("deepspeed_zero3", "deepspeed_zero3"),
    ],
)
def test_shipped_accelerate_configs_set_the_sharding(name, sharding, monkeypatch):
    from mmrft.runtime.distributed import sharding_from_launcher

    for key, value in _accelerate_env(REPO / "configs/accelerate" / f"{name}.yaml").items():
        monkeypatch.setenv(key, value)
    assert sharding_from_launcher("none", {}) == (sharding, {})


def test_accelerate_settings_translate_or_fail_by_name(monkeypatch, tmp_path):
    from mmrft.runtime.distributed import sharding_from_launcher
    from mmrft.typecheck import ConfigError

    def launched(**env: str) -> None:
        for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    launched(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2", FSDP_RESHARD_AFTER_FORWARD="false")
    assert sharding_from_launcher("none", {}) == ("fsdp_grad_op", {})
    assert sharding_from_launcher("fsdp_grad_op", {})[0] == "fsdp_grad_op"
    with pytest.raises(ConfigError, match=r"train\.sharding: 'fsdp_full'.*'fsdp_grad_op'"):
        sharding_from_launcher("fsdp_full", {})
    launched(ACCELERATE_USE_FSDP="true", FSDP_VERSION="1")
    with pytest.raises(ConfigError, match="fsdp_version 1.*fsdp_version: 2"):
        sharding_from_launcher("none", {})
    launched(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2", FSDP_CPU_RAM_EFFICIENT_LOADING="true")
    with pytest.raises(ConfigError, match="fsdp_cpu_ram_efficient_loading"):
        sharding_from_launcher("none", {})

    launched(
        ACCELERATE_USE_DEEPSPEED="true",
        ACCELERATE_DEEPSPEED_ZERO_STAGE="3",
        ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE="cpu",
        ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE="none",
    )
    assert sharding_from_launcher("none", {}) == (
        "deepspeed_zero3",
        {"offload_optimizer": {"device": "cpu"}},
    )
    launched(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="1")
    with pytest.raises(ConfigError, match="zero_stage 1.*stage 2 or 3"):
        sharding_from_launcher("none", {})

    # a DeepSpeed JSON as TRL / R1-V recipes ship it: its zero_optimization section is taken
    ds_json = tmp_path / "zero3.json"
    ds_json.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
                "train_micro_batch_size_per_gpu": "auto",
                "bf16": {"enabled": "auto"},
            }
        )
    )
    launched(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=str(ds_json))
    sharding, settings = sharding_from_launcher("none", {"reduce_bucket_size": 1000})
    assert sharding == "deepspeed_zero3"
    assert settings == {"offload_param": {"device": "cpu"}, "reduce_bucket_size": 1000}


def _mixed_media_worker(rank: int, world: int, out_dir: str) -> None:
    """Rank 0 forwards an image prompt, rank 1 a text-only pass, under ZeRO: both must stop
    with the message that names the way out, instead of hanging."""
    from mmrft.config import load_config
    from mmrft.policy.model import completion_logps, load_policy
    from mmrft.rewards.task import build_task
    from mmrft.runtime import distributed
    from mmrft.runtime.zero import run_deepspeed_config

    torch.set_num_threads(1)
    cfg = load_config(
        REPO / "configs/demo.yaml", ["train.sharding=deepspeed_zero2", "algorithm.beta=0"]
    )
    policy = load_policy(cfg.model, torch.device("cpu"))
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.1)
    distributed.prepare_optimizer(
        policy.model, optimizer, cfg.train.sharding, run_deepspeed_config(cfg, world)
    )
    try:
        if rank == 0:
            task = build_task(cfg.task.name, cfg.task.params)
            sample = task.read(REPO / cfg.data.train)[0][0]
            policy.family.annotate(sample)
            prepared = policy.family.prepare(
                policy.processor, [task.prompt(sample, policy.family)], True
            )
            rows = policy.family.split_rows(prepared, policy.processor)
            completion_logps(policy, rows, [[policy.pad_token_id]])
        else:
            distributed.padding_loss(policy.model, policy.pad_token_id)
        message = "no error"
    except RuntimeError as exc:
        message = str(exc)
    (Path(out_dir) / f"rank{rank}.txt").write_text(message)


@pytest.mark.skipif(bool(_needs("deepspeed")), reason="DeepSpeed not installed")
def test_deepspeed_stops_when_ranks_forward_different_media(tmp_path):
    run_ranks(_mixed_media_worker, str(tmp_path))
    for rank in (0, 1):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert "inputs differ" in message and "train.sharding=fsdp_full" in message, message
        assert "rank 1: text only" in message

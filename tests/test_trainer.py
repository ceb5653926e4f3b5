"""End-to-end training on the tiny model: smoke, checkpoint loading, resume, failures."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import length_plugin
from safetensors.torch import load_file

from mmrft.config import load_config
from mmrft.rewards.verifier import NonFiniteRewardError
from mmrft.training.trainer import train
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets/models/tiny-qwen2_5_vl"
BENCH = REPO / "assets/benchmarks/shapes_colour"


def tiny_config(tmp_path: Path, *extra: str):
    plugin = length_plugin(tmp_path)
    return load_config(
        REPO / "configs/demo.yaml",
        [
            f"output_dir={tmp_path}",
            "name=smoke",
            "warm_start.steps=0",
            "train.steps=3",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "data.max_test_samples=4",
            "eval.before=false",
            "train.completions_every=1",
            "checkpoint.every=2",
            "checkpoint.keep_last=2",
            f"plugins=[{plugin}]",
            "reward.verifiers=[{name: format}, {name: accuracy}, {name: test_length}]",
            *extra,
        ],
    )


def weights(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in directory.glob("*.safetensors"):
        out.update(load_file(str(file)))
    return out


def test_three_steps_change_parameters_and_checkpoint_loads(tmp_path):
    # A random model never writes the answer format, so format and accuracy are 0 for every
    # completion; the length reward differs inside each group and gives non-zero advantages.
    summary = train(tiny_config(tmp_path, "train.steps=3", "optim.lr=1e-2"))
    run = Path(summary["run_dir"])
    before = weights(MODEL)
    after_dir = run / "checkpoints" / "step-000003"
    after = weights(after_dir)
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed in 3 steps"

    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(after_dir)
    AutoProcessor.from_pretrained(after_dir)
    assert sum(p.numel() for p in model.parameters()) > 0

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "train/reward" in m]
    assert steps == [1, 2, 3]
    for key in (
        "train/reward/format",
        "train/reward/accuracy",
        "train/loss",
        "rollout/len_mean",
        "time/rollout_s",
    ):
        assert key in metrics[0], key
    assert (run / "config.yaml").is_file() and (run / "completions.jsonl").is_file()
    assert (run / "report.png").is_file() and (run / "summary.json").is_file()
    assert (run / "eval" / "after" / "predictions.jsonl").is_file()
    # keep-last-N: step 2 (periodic) and step 3 (final)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]


def test_resume_continues_from_the_saved_step(tmp_path):
    full = train(tiny_config(tmp_path, "name=full", "train.steps=4", "eval.after=false"))
    # an interrupted run: stop at step 2 (checkpoint), then resume to 4
    train(tiny_config(tmp_path, "name=cut", "train.steps=2", "eval.after=false"))
    cut_dir = tmp_path / "cut"
    resumed = train(tiny_config(tmp_path, "name=cut", "train.steps=4", "eval.after=false"))
    assert resumed["run_dir"] == str(cut_dir)
    lines = [json.loads(x) for x in (cut_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/reward" in m] == [1, 2, 3, 4]
    reference = [
        json.loads(x) for x in (Path(full["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    # same data, same sampling RNG: the resumed steps see the same rewards as the full run
    for a, b in zip(reference, lines):
        assert a["step"] == b["step"]
        assert a["train/reward"] == pytest.approx(b["train/reward"], abs=1e-6)


def test_nan_reward_stops_and_keeps_checkpoints(tmp_path):
    plugin = tmp_path / "nan_plugin.py"
    plugin.write_text(
        textwrap.dedent(
            """
            import math
            from mmrft import verifier

            CALLS = {"n": 0}

            @verifier("test_nan_after_two")
            def nan_after_two(completions, samples):
                if completions:
                    CALLS["n"] += 1
                value = math.nan if CALLS["n"] > 2 else 1.0
                return [value for _ in completions]
            """
        )
    )
    cfg = tiny_config(
        tmp_path,
        f"plugins=[{tmp_path / 'length_plugin.py'}, {plugin}]",
        "train.steps=4",
        "checkpoint.every=1",
        "reward.verifiers=[{name: test_nan_after_two}]",
    )
    with pytest.raises(NonFiniteRewardError, match=r"test_nan_after_two.*sample"):
        train(cfg)
    assert (tmp_path / "smoke" / "checkpoints" / "step-000002" / "trainer_state.pt").is_file()


def test_lora_checkpointing_frozen_vision_and_kl(tmp_path):
    """LoRA (merged into the saved checkpoint), gradient checkpointing, a frozen vision tower
    and β > 0 (a reference model is loaded) run together; the checkpoint loads with
    transformers, the vision weights are untouched and the language model changed."""
    summary = train(tiny_config(tmp_path, *_lora_overrides(), "train.steps=2"))
    run = Path(summary["run_dir"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "train/kl" in metrics[-1]
    saved = run / "checkpoints" / "step-000002"
    assert (saved / "adapter" / "adapter_model.safetensors").is_file()
    before, after = weights(MODEL), weights(saved)
    assert set(before) == set(after), "the merged checkpoint has the base model's keys"
    vision = [k for k in before if "visual" in k]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)
    language = [k for k in before if "visual" not in k and "proj" in k]
    assert any(not torch.equal(before[k], after[k]) for k in language)

    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.from_pretrained(saved)
    # resuming a LoRA run loads the adapter and continues
    resumed = train(tiny_config(tmp_path, *[*_lora_overrides(), "train.steps=3"]))
    assert resumed["steps"] == 3


def _lora_overrides() -> list[str]:
    return [
        "name=lora",
        "optim.lr=5e-2",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "model.gradient_checkpointing=true",
        "model.freeze_vision=true",
        "algorithm.beta=0.04",
        "eval.after=false",
    ]


def _metric_lines(run: Path) -> list[dict]:
    return [
        json.loads(x)
        for x in (run / "metrics.jsonl").read_text().splitlines()
        if "train/reward" in x
    ]


def test_dynamic_sampling_counts_what_it_generates_keeps_and_discards(tmp_path):
    summary = train(
        tiny_config(
            tmp_path,
            "name=dyn",
            "train.steps=2",
            "algorithm.dynamic_sampling=true",
            "algorithm.max_sampling_tries=3",
            # format + accuracy only: a random model scores 0 everywhere, so every group is
            # discarded and each step tries 3 times
            "reward.verifiers=[{name: format}, {name: accuracy}]",
            "eval.after=false",
        )
    )
    lines = _metric_lines(Path(summary["run_dir"]))
    for m in lines:
        assert m["rollout/tries"] == 3
        assert m["rollout/generated"] == 3 * 2 * 4
        assert m["rollout/kept"] == 0 and m["rollout/discarded"] == 24


def test_several_updates_per_batch_clip_and_overlong_shaping(tmp_path):
    summary = train(
        tiny_config(
            tmp_path,
            "name=mu",
            "train.steps=2",
            "optim.lr=5e-2",
            "algorithm.updates_per_batch=3",
            "algorithm.clip_low=0.01",
            "algorithm.clip_high=0.01",
            "algorithm.overlong_buffer=3",
            "eval.after=false",
        )
    )
    lines = _metric_lines(Path(summary["run_dir"]))
    assert any(m["train/clip_frac/total"] > 0 for m in lines), (
        "with μ > 1 the stored old policy makes the clip act"
    )
    assert all(m["train/reward/overlong"] <= 0 for m in lines)
    assert any(m["train/reward/overlong"] < 0 for m in lines)


SIGINT_PLUGIN = """
import os, signal
from mmrft import verifier

CALLS = {"n": 0}

@verifier("test_sigint_at_two")
def sigint_at_two(completions, samples):
    # runs in a verifier worker (reward.isolation: process): Ctrl-C goes to the trainer, its
    # parent, while the worker is busy; the worker ignores it and the step completes
    fired = __file__ + ".fired"  # once per test, across processes
    if completions:
        CALLS["n"] += 1
        if CALLS["n"] == 2 and not os.path.exists(fired):
            open(fired, "w").close()
            os.kill(os.getppid(), signal.SIGINT)
    return [min(len(c), 20) / 20 for c in completions]
"""


def test_ctrl_c_checkpoints_the_finished_step_then_resumes(tmp_path):
    plugin = tmp_path / "sigint_plugin.py"
    plugin.write_text(SIGINT_PLUGIN)
    overrides = [
        "name=ctrlc",
        "train.steps=4",
        "checkpoint.every=0",
        "eval.after=false",
        "reward.verifiers=[{name: test_sigint_at_two}]",
    ]
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path, *overrides, f"plugins=[{plugin}]"))
    run = tmp_path / "ctrlc"
    assert (run / "checkpoints" / "step-000002" / "trainer_state.pt").is_file()
    assert [m["step"] for m in _metric_lines(run)] == [1, 2]
    train(tiny_config(tmp_path, *overrides, f"plugins=[{plugin}]"))  # the 2nd call has passed
    assert [m["step"] for m in _metric_lines(run)] == [1, 2, 3, 4]


def test_non_finite_loss_writes_failure_and_keeps_checkpoints(tmp_path, monkeypatch):
    import mmrft.training.update as update_module

    real = update_module.grpo_loss
    calls = {"n": 0}

    def nan_on_third_update(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] >= 3 else loss), stats

    monkeypatch.setattr(update_module, "grpo_loss", nan_on_third_update)
    with pytest.raises(FloatingPointError, match="non-finite loss at step 3"):
        train(
            tiny_config(
                tmp_path,
                "name=nanloss",
                "train.steps=4",
                "checkpoint.every=1",
                "train.micro_batch_size=64",
            )
        )
    run = tmp_path / "nanloss"
    failure = json.loads((run / "failure.json").read_text())
    assert failure["step"] == 3 and failure["samples"]
    assert (run / "checkpoints" / "step-000002" / "trainer_state.pt").is_file()


def test_tensorboard_and_wandb_offline_trackers(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = train(
        tiny_config(
            tmp_path,
            "name=tracked",
            "train.steps=2",
            "train.trackers=[tensorboard, wandb]",
            "eval.after=false",
        )
    )
    run = Path(summary["run_dir"])
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    offline = list((run / "wandb").glob("offline-run-*"))
    assert offline and list(offline[0].glob("*.wandb"))


def test_kl_folded_into_the_reward(tmp_path):
    summary = train(
        tiny_config(
            tmp_path,
            "name=klr",
            "train.steps=2",
            "optim.lr=5e-2",
            "algorithm.beta=0.5",
            "algorithm.kl_mode=reward",
            "eval.after=false",
        )
    )
    lines = _metric_lines(Path(summary["run_dir"]))
    assert lines[0]["train/kl_in_reward"] == pytest.approx(
        0.0, abs=1e-6
    )  # policy = reference at step 1
    assert lines[1]["train/kl_in_reward"] > 0  # they differ after one update
    assert "train/kl" not in lines[1]  # no KL term in the loss


def test_kl_reference_is_the_warm_started_model_also_after_a_resume(tmp_path):
    """After a warm start the KL reference is the model RL starts from (KL 0 at step 1), not
    ``model.path``'s (KL to it pulled the policy back to writing no answer tags), and a resumed
    run compares against the same warm-started model."""
    settings = [
        "warm_start.steps=5",
        "warm_start.lr=3e-2",
        "optim.lr=5e-2",
        "algorithm.beta=0.5",
        "algorithm.kl_mode=reward",
        "checkpoint.every=1",
        "eval.after=false",
    ]
    full = train(tiny_config(tmp_path, "name=full", "train.steps=2", *settings))
    lines = _metric_lines(Path(full["run_dir"]))
    assert lines[0]["train/kl_in_reward"] == pytest.approx(0.0, abs=1e-6)
    assert lines[1]["train/kl_in_reward"] > 0
    train(tiny_config(tmp_path, "name=cut", "train.steps=1", *settings))
    resumed = train(tiny_config(tmp_path, "name=cut", "train.steps=2", *settings))
    again = _metric_lines(Path(resumed["run_dir"]))
    assert [m["step"] for m in again] == [1, 2]
    assert again[1]["train/kl_in_reward"] == pytest.approx(lines[1]["train/kl_in_reward"], rel=1e-4)


def test_heartbeat_names_the_phase_it_waits_on(caplog):
    import logging
    import time

    from mmrft.evaluation.runlog import Heartbeat

    caplog.set_level(logging.WARNING, logger="mmrft")
    with Heartbeat(0.2) as heartbeat:
        heartbeat.phase("verifier 'iou', step 7")
        time.sleep(0.7)
    assert "still in verifier 'iou', step 7 after" in caplog.text


def test_start_up_shows_the_config_diff_and_a_rendered_prompt_and_warns_without_signal(tmp_path):
    """Start-up prints only the keys that differ from the defaults and one rendered prompt with
    its media; completions.jsonl rows carry the prompt text; the warm start is logged; steps in
    which no group has reward variance (a random model scores 0 on format and accuracy) end in
    a warning naming the reasons."""
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    cfg = tiny_config(
        tmp_path,
        "train.steps=4",
        "warm_start.steps=2",
        "warm_start.batch_size=2",
        "train.warn_no_signal_steps=2",
        "reward.verifiers=[{name: format}, {name: accuracy}]",
        "eval.after=false",
        "task.params.think=none",
    )
    summary = train(cfg, Console(file=out, width=200))
    text = out.getvalue()
    diff = text.split("config, what differs from the defaults", 1)[1].split("reward =", 1)[0]
    assert "group_size: 4" in diff and "max_new_tokens: 6" in diff
    assert "kl_estimator" not in diff and "heartbeat_s" not in diff  # defaults are not shown
    assert "prompt of sample shapes_colour-train-" in text
    assert "<|vision_start|><|image_pad|>×4<|vision_end|>What colour is the shape?" in text
    assert "media:\n  image " in text and ".png: 56×56 px → 56×56 px, 4 tokens" in text
    assert text.count("no group had reward variance in the last 2 steps") == 1
    assert text.count("no group had reward variance in the last 4 steps") == 1
    assert "most frequent reasons: format/" in text or "most frequent reasons: accuracy/" in text
    run = Path(summary["run_dir"])
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert rows and all("<|image_pad|>×4<|vision_end|>What colour" in r["prompt"] for r in rows)
    warm = [json.loads(line) for line in (run / "warm_start.jsonl").read_text().splitlines()]
    assert [w["step"] for w in warm] == [1, 2] and all(w["loss"] > 0 for w in warm)


def test_evaluation_advances_a_progress_bar_batch_by_batch():
    from rich.console import Console
    from rich.progress import Progress

    from mmrft.evaluation.evaluate import evaluate
    from mmrft.evaluation.runlog import progress_bar
    from mmrft.policy.model import load_policy, resolve_family
    from mmrft.rewards.task import build_task, read_split

    cfg = load_config("demo")
    family = resolve_family(cfg.model)
    family.load_processor(cfg.model.path)
    task = build_task(cfg.task.name, cfg.task.params)
    samples = read_split(task, family, cfg.data.test, limit=5)
    policy = load_policy(cfg.model, torch.device("cpu"), trainable=False, family=family)
    seen = []

    class Spy(Progress):
        def update(self, task_id, **kwargs):
            seen.append(kwargs.get("completed"))
            super().update(task_id, **kwargs)

    with progress_bar(Console(quiet=True)) as base:
        spy = Spy(*base.columns, console=base.console)
        result = evaluate(policy, task, samples, 2, 4, progress=spy)
    assert seen == [2, 4, 5] and len(result.records) == 5 and not spy.tasks


def test_a_changed_config_never_resumes_silently(tmp_path):
    """Re-running with other settings names each changed key and the ways out; force resumes;
    train.steps (and other keys that change no step) may change; resume= is short for
    checkpoint.resume."""
    train(tiny_config(tmp_path, "name=run", "train.steps=2", "eval.after=false"))
    with pytest.raises(ConfigError) as caught:
        train(
            tiny_config(
                tmp_path, "name=run", "train.steps=3", "optim.lr=5e-4", "rollout.group_size=2"
            )
        )
    message = str(caught.value)
    for part in (
        "optim.lr: 0.001 → 0.0005",
        "rollout.group_size: 4 → 2",
        "checkpoint.resume=never",
        "name=",
        "checkpoint.resume=force",
    ):
        assert part in message, (part, message)
    assert "train.steps" not in message
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "lr: 0.001" in saved  # nothing was overwritten
    forced = train(
        tiny_config(
            tmp_path,
            "name=run",
            "train.steps=3",
            "optim.lr=5e-4",
            "resume=force",
            "eval.after=false",
        )
    )
    assert forced["steps"] == 3
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "train/reward" in m] == [1, 2, 3]


def test_a_run_saved_before_a_key_existed_resumes_with_its_default(tmp_path):
    """A key added to mmrft after a run was saved ran as its default then: at the default it is
    no change; set otherwise, it is one."""
    train(tiny_config(tmp_path, "name=old", "train.steps=1", "eval.after=false"))
    saved = tmp_path / "old" / "config.yaml"
    saved.write_text(saved.read_text().replace("  repetition_penalty: 1.0\n", ""))
    assert "repetition_penalty" not in saved.read_text()
    resumed = train(tiny_config(tmp_path, "name=old", "train.steps=2", "eval.after=false"))
    assert resumed["steps"] == 2
    saved.write_text(saved.read_text().replace("  repetition_penalty: 1.0\n", ""))
    with pytest.raises(ConfigError, match=r"rollout.repetition_penalty: 1.0 → 1.2"):
        train(tiny_config(tmp_path, "name=old", "train.steps=3", "rollout.repetition_penalty=1.2"))


def test_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    first = train(tiny_config(tmp_path, "name=done", "train.steps=2"))
    run_dir = tmp_path / "done"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    again = train(tiny_config(tmp_path, "name=done", "train.steps=2"))
    assert again == first
    # rich wraps the line at the run folder's path, whose length varies (xdist adds popen-gwN/)
    assert "is finished" in " ".join(capsys.readouterr().out.split())
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # no duplicate evaluation line, summary untouched


def test_mask_truncated_completions_leaves_them_out_of_the_loss(tmp_path):
    """With every completion cut by a 2-token limit and masking on, nothing is trained: the
    weights stay as they were; the share masked is logged."""
    summary = train(
        tiny_config(
            tmp_path,
            "name=masked",
            "train.steps=1",
            "rollout.max_new_tokens=2",
            "algorithm.mask_truncated_completions=true",
            "optim.weight_decay=0.0",
            "eval.after=false",
            "checkpoint.every=0",
        )
    )
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (step,) = [m for m in lines if "train/reward" in m]
    assert step["rollout/truncated"] == step["train/masked_truncated_frac"]
    if step["rollout/truncated"] == 1.0:
        after = weights(run_dir / "checkpoints" / "step-000001")
        before = weights(MODEL)
        assert all(torch.equal(after[k], before[k]) for k in before if k in after)

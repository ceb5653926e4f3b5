"""Plain reward functions (TRL's signature) named FILE.py:FUNCTION, and the prompt task that
trains on prompts and reward functions alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrft.config import load_config
from mmrft.data import Sample
from mmrft.rewards.reward import build_reward
from mmrft.rewards.task import build_task
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets/models/tiny-qwen2_5_vl"

# written as a TRL user writes them: completions plus the dataset's columns as keyword lists
TRL_FUNCTIONS = """
def accuracy_reward(completions, solution, **kwargs):
    return [1.0 if c.strip() == str(s) else 0.0 for c, s in zip(completions, solution)]

def level_bonus(completions, prompts, level, scale=1.0, **kwargs):
    return [None if lv is None else scale * lv + len(p) / 100 for lv, p in zip(level, prompts)]

def short(completions, **kwargs):
    return [1.0 if len(c) <= 3 else -1.0 for c in completions]

NOT_A_FUNCTION = 3
"""


def sample(i: int, answer: str, **meta) -> Sample:
    return Sample(f"s{i}", [{"role": "user", "content": f"question {i}"}], answer, meta)


def test_a_plain_function_gets_completions_targets_prompts_and_columns(tmp_path):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(TRL_FUNCTIONS)
    reward = build_reward(
        [
            {"name": f"{rewards}:accuracy_reward"},
            {"name": f"{rewards}:level_bonus", "weight": 0.5, "params": {"scale": 2.0}},
        ]
    )
    samples = [sample(0, "red", level=1), sample(1, "blue")]
    out = reward(["red", "green"], samples)
    accuracy = [s.value for s in out.scores["accuracy_reward"]]
    assert accuracy == [1.0, 0.0]
    bonus = out.scores["level_bonus"]
    assert bonus[0].value == pytest.approx(2.0 * 1 + len("question 0") / 100)
    assert bonus[1] is None  # the sample has no 'level': the function said "not applicable"
    assert out.total == pytest.approx([1.0 + 0.5 * bonus[0].value, 0.0])
    assert reward.range == (float("-inf"), float("inf"))  # a plain function declares none
    negative = build_reward([{"name": f"{rewards}:short"}])(["ok", "too long"], samples)
    assert negative.total == [1.0, -1.0]  # used as returned, no clipping to a range


def test_a_wrong_function_name_or_file_fails_at_start_up_naming_the_key(tmp_path):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(TRL_FUNCTIONS)
    with pytest.raises(ConfigError, match=r"reward.verifiers\[0\].name: .*did you mean 'short'"):
        build_reward([{"name": f"{rewards}:shrot"}])
    with pytest.raises(ConfigError, match=r"reward.verifiers\[0\].name: .*NOT_A_FUNCTION"):
        build_reward([{"name": f"{rewards}:NOT_A_FUNCTION"}])
    with pytest.raises(ConfigError, match=r"reward.verifiers\[0\].name: .*not found"):
        build_reward([{"name": f"{tmp_path / 'missing.py'}:short"}])


def test_a_relative_function_file_is_read_next_to_the_config(tmp_path):
    (tmp_path / "my_rewards.py").write_text(TRL_FUNCTIONS)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{path: {MODEL}}}\n"
        "task: {name: prompt}\n"
        "data: {train: p.jsonl}\n"
        "reward: {verifiers: [{name: my_rewards.py:short}]}\n"
        "eval: {verifiers: [{name: my_rewards.py:accuracy_reward}]}\n"
    )
    cfg = load_config(config)
    assert cfg.reward.verifiers[0]["name"] == f"{tmp_path / 'my_rewards.py'}:short"
    assert cfg.eval.verifiers[0]["name"] == f"{tmp_path / 'my_rewards.py'}:accuracy_reward"


def test_the_prompt_task_reads_prompt_only_rows_and_asks_for_reward_functions(tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "Say hi", "level": 2}, {"prompt": "Say bye", "solution": "bye"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task("prompt", {})
    samples, _ = task.read(data)
    assert [(s.text(), s.target, s.meta) for s in samples] == [
        ("Say hi", None, {"level": 2}),
        ("Say bye", "bye", {}),
    ]
    with pytest.raises(ConfigError, match=r"reward.verifiers: task 'prompt'.*my_rewards.py"):
        task.default_verifiers()
    with pytest.raises(Exception, match=r"no answer \(task 'qa' needs one.*task.name=prompt"):
        build_task("qa", {}).read(data)


def test_training_on_prompts_and_reward_functions_alone(tmp_path):
    """A TRL-style start: prompts, two plain functions, no task-specific anything. Two RL
    steps, then the evaluation reports the weighted reward as the metric."""
    from mmrft.training.trainer import train

    (tmp_path / "my_rewards.py").write_text(TRL_FUNCTIONS)
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Say {w}", "solution": w}) + "\n" for w in "abcdef")
    )
    cfg = load_config(
        None,
        [
            f"model.path={MODEL}",
            "task.name=prompt",
            f"data.train={data}",
            f"data.test={data}",
            f"output_dir={tmp_path}",
            "name=prompts",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=4",
            "warm_start.steps=0",
            "eval.before=false",
            f"reward.verifiers=[{{name: {tmp_path}/my_rewards.py:short}}, "
            f"{{name: {tmp_path}/my_rewards.py:accuracy_reward, weight: 2}}]",
        ],
    )
    summary = train(cfg)
    assert summary["metric"] == "eval/prompt/reward"
    results = json.loads((tmp_path / "prompts/eval/after/results.json").read_text())
    predictions = [
        json.loads(line)
        for line in (tmp_path / "prompts/eval/after/predictions.jsonl").read_text().splitlines()
    ]
    expected = [
        (1.0 if len(p["completion"]) <= 3 else -1.0) + 2 * (p["completion"].strip() == p["target"])
        for p in predictions
    ]
    assert [p["score"] for p in predictions] == expected
    assert results["metrics"]["reward"] == pytest.approx(sum(expected) / len(expected))
    assert summary["after"] == pytest.approx(results["metrics"]["reward"])
    assert "verifier/short" in results["metrics"]  # named by the function, not the path
    assert not any(str(tmp_path) in key for key in results["metrics"])


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_plain_function_that_hangs_scores_zero_with_a_reason(tmp_path, isolation):
    """A plain function has no declared minimum (−inf would stop the run as non-finite): the
    completion that hangs scores 0 with reason `timeout`, the others as returned."""
    rewards = tmp_path / "slow_rewards.py"
    rewards.write_text(
        "import time\n"
        "def slow(completions, **kwargs):\n"
        "    if any('hang' in c for c in completions):\n"
        "        time.sleep(30)\n"
        "    return [-2.0 for c in completions]\n"
    )
    reward = build_reward([{"name": f"{rewards}:slow"}], timeout_s=1.0, isolation=isolation)
    try:
        out = reward(["fine", "hang"], [sample(0, "a"), sample(1, "b")])
    finally:
        reward.close()
    if isolation == "process":  # the culprit alone
        assert out.total == [-2.0, 0.0]
    else:  # a thread cannot tell which: the whole call
        assert out.total == [0.0, 0.0]
    assert out.reasons["slow/timeout"] >= 1


def test_reward_functions_are_named_by_the_function_in_metrics(tmp_path, caplog):
    """Metric keys (``verifier/<name>``, ``train/reasons/<name>/...``) are the same on every
    machine: the function's name, ``stem:function`` where two entries share it, the spec as
    written only where that is shared too; the log line keeps the full path."""
    import logging

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "my_rewards.py").write_text(TRL_FUNCTIONS)
    (tmp_path / "a" / "extra.py").write_text(TRL_FUNCTIONS + "\naccuracy = short\nformat = short\n")
    a, b, extra = (
        tmp_path / "a/my_rewards.py",
        tmp_path / "b/my_rewards.py",
        tmp_path / "a/extra.py",
    )
    samples = [sample(0, "red"), sample(1, "blue")]

    def inline(specs):
        return build_reward(specs, isolation="inline")

    with caplog.at_level(logging.INFO, logger="mmrft.rewards.reward"):
        reward = inline([{"name": f"{a}:short"}, {"name": f"{a}:accuracy_reward"}])
    assert reward.names == ["short", "accuracy_reward"]
    assert set(reward(["ok", "too long"], samples).scores) == {"short", "accuracy_reward"}
    assert f"reward function 'short' is {a}:short" in caplog.text  # where it came from, once
    # the full spec still finds it (mmrft verify, a resumed config naming it)
    assert reward.bound(f"{a}:short") is reward.bound("short")
    assert reward.score_one("short", ["ok"], samples[:1])[0].value == 1.0

    # two functions of one name in two files: stem:function
    reward = inline([{"name": f"{a}:short"}, {"name": f"{extra}:short", "weight": 2}])
    assert reward.names == ["my_rewards:short", "extra:short"]
    # ...in two files of one stem: the specs as written (still distinct)
    reward = inline([{"name": f"{a}:short"}, {"name": f"{b}:short"}])
    assert reward.names == [f"{a}:short", f"{b}:short"]
    # a function named like a registered verifier never takes its name
    reward = inline([{"name": "accuracy"}, {"name": f"{extra}:accuracy"}])
    assert reward.names == ["accuracy", "extra:accuracy"]
    reward = inline([{"name": f"{extra}:format"}])
    assert reward.names == ["extra:format"]
    out = reward(["ok", "too long"], samples)
    assert list(out.scores) == ["extra:format"] and out.total == [1.0, -1.0]


def test_a_config_with_a_reward_function_resumes_as_before(tmp_path):
    """The resume guard compares the configs, whose reward.verifiers keep the anchored spec:
    a run saved before the metric names changed resumes without a changed key."""
    from mmrft.config import to_yaml
    from mmrft.training.resume import config_changes

    (tmp_path / "my_rewards.py").write_text(TRL_FUNCTIONS)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{path: {MODEL}}}\ntask: {{name: prompt}}\n"
        "reward: {verifiers: [{name: my_rewards.py:short}]}\ntrain: {steps: 0}\n"
    )
    saved = to_yaml(load_config(config))
    assert f"{tmp_path / 'my_rewards.py'}:short" in saved  # what an older checkpoint holds
    assert config_changes(saved, load_config(config)) == ({}, {})

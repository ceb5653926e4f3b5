"""Verifier plugins that break the contract (issue 12, item 6).

A value outside the declared range, NaN/inf, an exception, the wrong number of results: each
stops scoring with one line naming the verifier, the step and the samples; ``mmrft`` exits
with status 2 (no traceback) and earlier checkpoints stay intact. ``mmrft verify`` runs under
``reward.timeout_s``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from helpers import NO_EVAL, one_error_line, short_run

from mmrft import Sample, Score, verifier
from mmrft.cli import main
from mmrft.rewards.reward import build_reward
from mmrft.rewards.verifier import NonFiniteRewardError, RewardError, VerifierError, write_failure

PLUGIN = '''
import math, time
from mmrft import Score, verifier

CALLS = {"n": 0}


@verifier("test_raises_from_step_2")
def raises_from_step_2(completions, samples):
    """Scores 0.5, then raises from its second non-empty call on (step 2 of a training run)."""
    if completions:
        CALLS["n"] += 1
        if CALLS["n"] >= 2:
            raise KeyError("boom\\nwith a second line")
    return [0.5 for _ in completions]


@verifier("test_raises")
def raises(completions, samples):
    if completions:
        raise ValueError("cannot score [this]")
    return []


@verifier("test_out_of_range", low=0.0, high=1.0)
def out_of_range(completions, samples):
    return [1e6 for _ in completions]


@verifier("test_nan")
def nan(completions, samples):
    return [math.nan for _ in completions]


@verifier("test_hangs")
def hangs(completions, samples):
    while completions:
        time.sleep(0.05)
    return []
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "bad_plugins.py"
    path.write_text(PLUGIN)
    return path


@verifier("test_returns", low=0.0, high=1.0)
def returns(completions, samples, *, value: float = 0.5, part: float = 0.0):
    """Returns ``value`` (a Score with sub-score ``part``) for every completion."""
    return [Score(value, parts={"p": part}) if completions else None for _ in completions]


@verifier("test_misbehaves")
def misbehaves(completions, samples, *, how: str = "count"):
    if not completions:
        return []
    if how == "count":
        return [1.0]
    if how == "string":
        return ["1.0" for _ in completions]
    if how == "reason":
        return [Score(0.0, reason=3) for _ in completions]
    raise AssertionError(how)


def samples(n: int) -> list[Sample]:
    return [Sample(id=f"s{i}", messages=[]) for i in range(n)]


# -- the reward API --------------------------------------------------------------------------


def test_out_of_range_is_an_error_naming_verifier_sample_and_value():
    reward = build_reward([{"name": "test_returns", "params": {"value": 1e6}}])
    with pytest.raises(VerifierError) as info:
        reward(["x", "y"], samples(2), context="at step 7")
    message = str(info.value)
    assert message == (
        "verifier 'test_returns' returned 1e+06, outside its declared range [0, 1], "
        "for sample 's0' at step 7"
    )
    assert (info.value.step, info.value.sample_ids, info.value.value) == (7, ["s0"], 1e6)


def test_float_noise_at_the_bounds_is_clipped():
    reward = build_reward([{"name": "test_returns", "params": {"value": 1 + 1e-9}}])
    assert reward(["x"], samples(1)).total == [1.0]


def test_a_raising_verifier_stops_with_one_line_naming_verifier_step_and_samples(plugin):
    from mmrft.plugins import load_plugins

    load_plugins([str(plugin)])
    reward = build_reward([{"name": "test_raises"}])
    with pytest.raises(VerifierError) as info:
        reward(["a", "b", "c"], samples(3), context="at step 3")
    assert str(info.value) == (
        "verifier 'test_raises' raised ValueError: cannot score [this] at step 3 on samples "
        "s0, s1, s2"
    )
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.failure() == {
        "step": 3,
        "reason": str(info.value),
        "verifier": "test_raises",
        "samples": ["s0", "s1", "s2"],
    }


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        (
            [{"name": "test_returns", "params": {"value": math.nan}}],
            r"returned nan for sample 's0'",
        ),
        ([{"name": "test_returns", "params": {"value": -math.inf}}], r"returned -inf"),
        ([{"name": "test_returns", "params": {"part": math.inf}}], r"sub-score 'p' = inf"),
        (
            [
                {"name": "test_returns", "weight": 1e308, "params": {"value": 1.0}},
                {"name": "test_misbehaves", "weight": 1e308, "params": {"how": "string"}},
            ],
            r"returned a str",  # checked before any total
        ),
    ],
)
def test_non_finite_and_non_numeric_results_stop(specs, match):
    with pytest.raises(RewardError, match=match) as info:
        build_reward(specs)(["x"], samples(1), context="at step 2")
    assert "step 2" in str(info.value) and "\n" not in str(info.value)


def test_an_overflowing_weighted_total_is_non_finite():
    reward = build_reward(
        [
            {"name": "test_returns", "weight": 1e308, "params": {"value": 1.0}},
            {"name": "test_const_one", "weight": 1e308},
        ]
    )
    with pytest.raises(NonFiniteRewardError, match=r"weighted reward is inf for sample 's0'"):
        reward(["x"], samples(1))


@verifier("test_const_one")
def const_one(completions, samples):
    return [1.0 for _ in completions]


@pytest.mark.parametrize(
    ("how", "match"),
    [("count", r"returned 1 results for 2 completions"), ("reason", r"a int as reason")],
)
def test_wrong_shapes_stop(how, match):
    reward = build_reward([{"name": "test_misbehaves", "params": {"how": how}}])
    with pytest.raises(VerifierError, match=match):
        reward(["x", "y"], samples(2))


def test_write_failure(tmp_path):
    error = NonFiniteRewardError(
        "verifier 'v' returned nan for sample 's1' at step 4",
        verifier="v",
        sample_ids=["s1"],
        context="at step 4",
    )
    path = write_failure(tmp_path, error)
    assert json.loads(path.read_text()) == {
        "step": 4,
        "reason": str(error),
        "verifier": "v",
        "samples": ["s1"],
    }
    assert json.loads(write_failure(tmp_path, error, step=5).read_text())["step"] == 5
    assert [p.name for p in tmp_path.iterdir()] == ["failure.json"]


# -- mmrft verify ------------------------------------------------------------------------------


def completions_file(tmp_path: Path, n: int = 2) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"completion": "x", "target": 1}) + "\n" for _ in range(n)))
    return path


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("test_raises", "verifier 'test_raises' raised ValueError: cannot score [this] in "),
        ("test_out_of_range", "verifier 'test_out_of_range' returned 1e+06, outside its"),
        ("test_nan", "verifier 'test_nan' returned nan for sample '1' in "),
    ],
)
def test_verify_exits_2_with_one_line(tmp_path, capsys, plugin, name, expected):
    path = completions_file(tmp_path)
    assert main(["verify", name, str(path), "--plugin", str(plugin)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + expected), captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.serial  # wall-clock budget: make test runs it alone
def test_verify_has_a_time_budget(tmp_path, capsys, plugin):
    path = completions_file(tmp_path)
    start = time.monotonic()
    args = ["verify", "test_hangs", str(path), "reward.timeout_s=1", "--plugin", str(plugin)]
    assert main(args) == 0
    assert time.monotonic() - start < 1 + 5
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(o["score"], o["reason"]) for o in out] == [(0.0, "timeout")] * 2
    assert main([*args, "reward.on_timeout=stop"]) == 2
    err = capsys.readouterr().err
    assert "verifier 'test_hangs' exceeded its 1s budget" in err and "1, 2" in err
    assert main(["verify", "test_hangs", str(path), "reward.timeout_s=soon"]) == 2
    assert "reward.timeout_s" in capsys.readouterr().err


# -- mmrft train -------------------------------------------------------------------------------


def train_args(tmp_path: Path, plugin: Path, verifiers: str, *extra: str) -> list[str]:
    return [
        "train",
        *short_run(tmp_path, "plugin", steps=3),
        "data.max_test_samples=2",
        *NO_EVAL,
        "checkpoint.every=1",
        "checkpoint.keep_last=3",
        f"plugins=[{plugin}]",
        f"reward.verifiers={verifiers}",
        *extra,
    ]


def test_train_stops_with_exit_2_and_one_line_when_a_verifier_raises(tmp_path, capsys, plugin):
    from safetensors.torch import load_file

    args = train_args(tmp_path, plugin, "[{name: test_raises_from_step_2}]")
    assert main(args) == 2
    error = one_error_line(capsys.readouterr().err)
    assert error.startswith("error: verifier 'test_raises_from_step_2' raised KeyError: ")
    assert "at step 2 on samples shapes" in error
    checkpoint = tmp_path / "plugin" / "checkpoints" / "step-000001"
    assert (checkpoint / "trainer_state.pt").is_file()
    assert all(load_file(str(f)) for f in checkpoint.glob("*.safetensors"))
    assert not (tmp_path / "plugin" / "checkpoints" / "step-000002").exists()


@pytest.mark.parametrize("name", ["test_raises", "test_nan"])
def test_train_writes_failure_json_with_the_step_and_samples(tmp_path, capsys, plugin, name):
    assert main(train_args(tmp_path, plugin, f"[{{name: {name}}}]")) == 2
    failure = json.loads((tmp_path / "plugin" / "failure.json").read_text())
    assert failure["step"] == 1 and failure["samples"] and failure["verifier"] == name
    assert failure["reason"] in capsys.readouterr().err
